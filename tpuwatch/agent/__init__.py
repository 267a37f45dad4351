"""The in-process agent: runs inside the training process (TensorFlow allowed, Textual never)."""
