//! The runner: runs inside the pipeline step on a GPU node. Decodes `KERNELBOT_PAYLOAD`,
//! evaluates the submission and writes `result.json` to the current directory (or to the
//! directory given as the only argument). See `kernelbot_protocol::exit` for its exit codes.

fn main() {
    let out_dir = std::env::args_os()
        .nth(1)
        .map_or_else(|| std::path::PathBuf::from("."), Into::into);
    let code = kernelbot_runner::run(&|name| std::env::var(name).ok(), &out_dir);
    std::process::exit(code);
}
