"""Process control: starting a run (one process or a group of workers), talking to its agent's
socket, sending it commands, asking for stack dumps and stopping it. No TensorFlow, no Textual."""
