//! Lets the binary find libtorch at run time and keeps CUDA usable.
//!
//! torch-sys links libtorch from the PyPI wheel but sets no rpath for downstream binaries, and
//! Rust links with --as-needed, which drops libtorch_cuda (nothing references it directly), so
//! `Device::cuda_if_available()` would never see a GPU. Both are fixed here.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    let dir = std::path::Path::new(&lib);
    if dir.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-L{lib}");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
