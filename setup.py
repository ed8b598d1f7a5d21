"""Packaging for ndq_tf."""

from setuptools import find_packages, setup

setup(
    name="ndq_tf",
    version="0.1.0",
    description=(
        "Nested and subtractive dithered quantization of gradients for "
        "TensorFlow/Keras distributed training."
    ),
    packages=find_packages(include=["ndq_tf", "ndq_tf.*"]),
    python_requires=">=3.10",
    install_requires=[
        # The versions the test suite has run on; widen once tested.
        "tensorflow>=2.21,<2.22",
        "keras>=3.15,<3.16",
        "numpy",
        "absl-py",
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist", "scikit-learn"],
        "bench": ["matplotlib", "scikit-learn"],
    },
)
