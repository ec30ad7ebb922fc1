from setuptools import find_packages, setup

setup(
    name="tfos",
    version="0.1.0",
    description="Turn a Spark cluster into a distributed TensorFlow cluster",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfos", "tfos.*"]),
    python_requires=">=3.10",
    install_requires=["pyarrow>=14", "numpy", "tqdm", "protobuf>=4.23", "google-crc32c>=1.5"],
    extras_require={
        "tf": ["tensorflow-cpu>=2.16; platform_machine=='x86_64'", "tensorflow>=2.16; platform_machine!='x86_64'"],
        "spark": ["pyspark>=3.5", "pandas>=2.2,<3"],
        "examples": ["scikit-learn", "tf-keras"],
        "test": ["pytest>=7", "pytest-timeout", "psutil", "scikit-learn", "tf-keras", "tensorboard", "tqdm", "nbclient", "nbformat", "ipykernel"],
        "tensorboard": ["tensorboard"],
        "horovod": ["horovod>=0.28"],
    },
)
