//! Generates the `converge.v1` types and services from `proto/`, plus the descriptor set that
//! server reflection serves (so grpcurl needs no .proto files).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let protos =
        ["common.proto", "agent.proto", "control.proto"].map(|f| root.join("converge/v1").join(f));
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);

    let mut config = prost_build::Config::new();
    // A fresh machine has no protoc: use the vendored one unless the user points at their own.
    match std::env::var_os("PROTOC") {
        Some(p) => config.protoc_executable(p),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };
    tonic_prost_build::configure()
        // The agent RPC is called `Connect`; the transport helper of the same name would clash
        // with it, and clients build their channel themselves anyway.
        .build_transport(false)
        .file_descriptor_set_path(out.join("converge_descriptor.bin"))
        .compile_with_config(config, &protos, std::slice::from_ref(&root))?;
    println!("cargo:rerun-if-changed={}", root.display());
    println!("cargo:rerun-if-env-changed=PROTOC");
    Ok(())
}
