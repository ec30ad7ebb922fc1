// Links the plugin against the TensorFlow framework library it is loaded into (TF_SetStatus lives
// there); TFOS_TF_LIB names its directory (tf.sysconfig.get_lib()).
fn main() {
    println!("cargo:rerun-if-env-changed=TFOS_TF_LIB");
    let lib = std::env::var("TFOS_TF_LIB").expect("set TFOS_TF_LIB to tf.sysconfig.get_lib()");
    println!("cargo:rustc-link-search=native={lib}");
    println!("cargo:rustc-link-lib=dylib:+verbatim=libtensorflow_framework.so.2");
}
