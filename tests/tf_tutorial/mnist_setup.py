"""TensorFlow's multi-worker Keras tutorial's mnist_setup.py (tensorflow.org, "Multi-worker training
with Keras"), unchanged but for the data: this machine cannot download MNIST, so the same shapes come
from scikit-learn's bundled 8x8 digits, scaled up to 28x28. Every sixth digit is held out: the
set's last digits come from other writers, and held out as a tail they made the accuracy swing
from 0.70 to 0.92 between runs of the (unseeded) tutorial."""

import numpy as np
import tensorflow as tf


def mnist_dataset(batch_size):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    train = np.arange(len(y)) % 6 != 0
    x_train = np.kron(x.reshape(-1, 8, 8)[train], np.ones((1, 4, 4)))[:, 2:30, 2:30] / np.float32(16)
    y_train = y[train].astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(1500).repeat().batch(batch_size)
    return train_dataset


def held_out():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    held = np.arange(len(y)) % 6 == 0
    return np.kron(x.reshape(-1, 8, 8)[held], np.ones((1, 4, 4)))[:, 2:30, 2:30] / np.float32(16), y[held]


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
        metrics=['accuracy'])
    return model
