from setuptools import find_packages, setup

setup(
    name="tfos",
    version="0.1.0",
    description="Turn a Spark cluster into a distributed TensorFlow cluster",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfos", "tfos.*"]),
    package_data={"tfos.data": ["hdfs_tf/Cargo.toml", "hdfs_tf/Cargo.lock", "hdfs_tf/build.rs", "hdfs_tf/src/*.rs"],
                  "tfos.tf": ["gloo_cc/*.cc"]},
    python_requires=">=3.10",
    install_requires=["pyarrow>=14", "numpy", "tqdm", "protobuf>=4.23", "google-crc32c>=1.5"],
    extras_require={
        # Pick one TensorFlow: "tf" (CPU wheels, the default for CPU clusters) or "gpu" (TensorFlow
        # with its CUDA wheels, for GPU hosts). TensorFlow 2.21 no longer pulls in tensorboard,
        # which tensorboard=True (driver) and Keras' TensorBoard callback (nodes) need.
        "tf": ["tensorflow-cpu>=2.16; platform_machine=='x86_64'", "tensorflow>=2.16; platform_machine!='x86_64'",
               "tensorboard"],
        "gpu": ["tensorflow[and-cuda]>=2.16", "tensorboard"],
        "spark": ["pyspark>=3.5", "pandas>=2.2,<3"],
        "connect": ["pyspark[connect]>=3.5", "pandas>=2.2,<3"],
        "keras2": ["tf-keras"],
        "examples": ["scikit-learn", "tf-keras"],
        "test": ["pytest>=7", "pytest-timeout", "psutil", "scikit-learn", "tf-keras", "tensorboard", "tqdm", "nbclient", "nbformat", "ipykernel",
                 "mlflow>=3,<4", "hdfs-native>=0.14", "hdfs>=2.7"],
        "tensorboard": ["tensorboard"],
        "horovod": ["horovod>=0.28"],
        # Gloo CPU all-reduce for tfos.keras_dist (PyTorch's torch.distributed). Take the CPU wheel
        # (~190 MB): pip install torch --index-url https://download.pytorch.org/whl/cpu
        "gloo": ["torch>=2.3"],
        "mlflow": ["mlflow>=3,<4"],
        # hdfs:// and viewfs:// without a JVM or a Hadoop install (HDFS RPC in Rust; Kerberos, HA)
        "hdfs": ["hdfs-native>=0.14"],
        "all": ["tensorflow-cpu>=2.16; platform_machine=='x86_64'", "tensorflow>=2.16; platform_machine!='x86_64'",
                "tensorboard", "pyspark>=3.5", "pandas>=2.2,<3", "tf-keras", "scikit-learn"],
    },
)
