"""Crash: Keras 2 code on Keras 3 -- ``keras.models.load_model`` of a SavedModel directory."""
import os
import tempfile

import keras
import numpy as np

from _common import small_model

exported = os.path.join(tempfile.mkdtemp(), "serving")
small_model().export(exported, verbose=False)  # what an older training run left behind

model = keras.models.load_model(exported)
print(model(np.zeros((2, 8), "float32")))
