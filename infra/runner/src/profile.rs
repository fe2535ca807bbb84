//! Profile mode's parts, as kernelbot's runners have them: the profiler each runtime's
//! program is wrapped in (Nsight Compute on CUDA, rocprofv3 on ROCm), the Nsight tables
//! kernelbot keeps for its report, and the profiler's files zipped for download. The zip
//! takes only regular files the program's uid owns, never following a link, and stops at
//! [`MAX_ZIP_BYTES`].

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use kernelbot_protocol::ProfileOptions;

/// The largest profile zip kept as an artifact.
pub(crate) const MAX_ZIP_BYTES: u64 = 64 * 1024 * 1024;
/// The most a zip reads of the profiler's files (they compress well; a sparse file would not
/// make a large zip, only a long read).
const MAX_READ_BYTES: u64 = 1024 * 1024 * 1024;
/// The most files a zip takes.
const MAX_FILES: usize = 10_000;
/// The Nsight tables kernelbot's report shows.
const NCU_TABLES: &[&str] = &[
    "GPU Throughput",
    "Pipe Utilization (% of active cycles)",
    "Warp State (All Cycles)",
];
/// Kernelbot's own bound on the tables' lines (a Discord message must hold them).
const NCU_MAX_LINES: usize = 100;

/// The profiler of a runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Profiler {
    NsightCompute,
    RocProf,
}

impl Profiler {
    /// The profiler for `system.runtime` (`CUDA`, `ROCm`), if there is one.
    pub(super) fn for_runtime(runtime: &str) -> Option<Self> {
        match runtime {
            "CUDA" => Some(Self::NsightCompute),
            "ROCm" => Some(Self::RocProf),
            _ => None,
        }
    }

    /// Its name in `ProfileResult.profiler`, as kernelbot writes it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::NsightCompute => "Nsight-Compute",
            Self::RocProf => "rocPROF",
        }
    }

    /// The variable the program is told it runs under the profiler with.
    pub(super) fn env(self) -> (&'static str, String) {
        match self {
            Self::NsightCompute => ("POPCORN_NCU", "1".into()),
            Self::RocProf => ("GPU_DUMP_CODE_OBJECT", "1".into()),
        }
    }

    /// `program` wrapped in the profiler, its files going to `out`; Nsight Compute measures
    /// the kernels and launches `options` name (kernelbot's `-c 10` by default).
    pub(super) fn wrap(
        self,
        out: &Path,
        options: &ProfileOptions,
        program: &[String],
    ) -> Vec<String> {
        let out = out.to_string_lossy();
        let mut args: Vec<String> = match self {
            Self::NsightCompute => [
                "ncu",
                "--set",
                "full",
                "--nvtx",
                "--nvtx-include",
                "custom_kernel/",
                "--import-source",
                "1",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .chain(options.ncu_args())
            .chain(["-o".into(), format!("{out}/profile.ncu-rep"), "--".into()])
            .collect(),
            Self::RocProf => [
                "rocprofv3",
                "--log-level",
                "fatal",
                "--hip-trace",
                "--kernel-trace",
                "--rccl-trace",
                "--marker-trace",
                "--hip-trace",
                "--memory-copy-trace",
                "--scratch-memory-trace",
                "--output-format",
                "pftrace",
                "csv",
                "-d",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .chain([out.into_owned(), "-o".into(), "%pid%".into(), "--".into()])
            .collect(),
        };
        args.extend(program.iter().cloned());
        args
    }

    /// Whether a file the program left in its working directory belongs with the profile:
    /// the code objects `GPU_DUMP_CODE_OBJECT` dumps there (kernelbot zips them too).
    pub(super) fn keeps(self, name: &str) -> bool {
        self == Self::RocProf
            && !name.contains('/')
            && name.starts_with("_code_object")
            && name.ends_with(".o")
            && plain_name(Path::new(name)).is_some()
    }

    /// The command that prints the tables of the report in `out` (Nsight Compute only).
    pub(super) fn tables_command(self, out: &Path) -> Option<Vec<String>> {
        (self == Self::NsightCompute).then(|| {
            let report = format!("{}/profile.ncu-rep", out.to_string_lossy());
            ["ncu", "--import", &report, "--print-details", "body"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect()
        })
    }
}

/// What kernelbot keeps of `ncu --print-details body`: each kernel's header line, and for the
/// first two kernels the tables in [`NCU_TABLES`], at most [`NCU_MAX_LINES`] table lines.
pub(super) fn filter_ncu_report(report: &str) -> String {
    let (mut out, mut kernels, mut collect, mut lines) = (String::new(), 0, false, 0);
    for line in report.lines() {
        let b = line.as_bytes();
        if b.len() >= 3 && b[1] == b' ' && b[2] != b' ' {
            if kernels != 0 {
                out.push('\n');
            }
            kernels += 1;
            if kernels == 3 {
                out.push_str("\nAdditional kernel launches follow. Please check the .ncu-rep file for more details.\n");
            }
            out.push_str(line);
            out.push('\n');
        }
        if kernels > 2 {
            continue;
        }
        if let Some(at) = line.find("Table Name :") {
            let table = line[at + "Table Name :".len()..].trim();
            collect = NCU_TABLES.contains(&table);
            if collect {
                out.push('\n');
            }
        }
        if line.trim().is_empty() {
            collect = false;
        }
        if collect {
            out.push_str(line);
            out.push('\n');
            lines += 1;
            if lines > NCU_MAX_LINES {
                out.push_str("\n[...]\nReport has been truncated. Please check the .ncu-rep file for more details.\n");
                break;
            }
        }
    }
    out
}

/// Why a profile's files were not kept.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ZipError {
    #[error("the profiler's files are over {} MiB zipped", MAX_ZIP_BYTES / (1024 * 1024))]
    TooLarge,
    #[error("the profiler left more than {MAX_FILES} files")]
    TooManyFiles,
    #[error("the profiler left no files")]
    Empty,
    #[error("the profiler's directory is not the one it was given")]
    NotItsDirectory,
    #[error("the profiler's files could not be zipped: {0}")]
    Io(#[from] io::Error),
    #[error("the profiler's files could not be zipped: {0}")]
    Zip(#[from] zip::result::ZipError),
}

/// Zips the regular files under `dir` that `owner` owns into `to` (removed again on any
/// error): the profiler's output, written by the program's uid.
pub(super) fn zip_dir(dir: &Path, owner: u32, to: &Path) -> Result<u64, ZipError> {
    // The program owned the directory it sat in: it may have put a link in its place.
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != owner {
        return Err(ZipError::NotItsDirectory);
    }
    let files = files_of(dir, owner)?;
    if files.is_empty() {
        return Err(ZipError::Empty);
    }
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(to)?;
    let written = write_zip(files, owner, out);
    if written.is_err() {
        let _ = std::fs::remove_file(to);
    }
    written
}

fn write_zip(files: Vec<(String, PathBuf)>, owner: u32, out: File) -> Result<u64, ZipError> {
    let mut zip = zip::ZipWriter::new(Capped {
        file: out,
        max: MAX_ZIP_BYTES,
    });
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    let mut budget = MAX_READ_BYTES;
    for (name, path) in files {
        let Some(mut file) = open_owned(&path, owner)? else {
            continue;
        };
        zip.start_file(name, options).map_err(too_large)?;
        let copied =
            io::copy(&mut (&mut file).take(budget), &mut zip).map_err(|e| too_large(e.into()))?;
        budget = budget.saturating_sub(copied);
        if budget == 0 {
            return Err(ZipError::TooLarge);
        }
    }
    let mut capped = zip.finish().map_err(too_large)?;
    Ok(capped.file.stream_position()?)
}

/// An error writing the zip: past the cap it is [`ZipError::TooLarge`].
fn too_large(e: zip::result::ZipError) -> ZipError {
    match &e {
        zip::result::ZipError::Io(io) if io.kind() == io::ErrorKind::FileTooLarge => {
            ZipError::TooLarge
        }
        _ => ZipError::Zip(e),
    }
}

/// Every entry under `dir` that is a regular file of `owner`'s (symlinks and anything else
/// skipped), by its name inside `dir`, in order; names that are not plain (`[A-Za-z0-9._-]`
/// parts) are left out, so the zip unpacks where it is opened, on any system.
fn files_of(dir: &Path, owner: u32) -> Result<Vec<(String, PathBuf)>, ZipError> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d)? {
            seen += 1;
            if seen > MAX_FILES {
                return Err(ZipError::TooManyFiles);
            }
            let path = entry?.path();
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.uid() != owner {
                continue;
            }
            if meta.is_dir() {
                dirs.push(path);
            } else if meta.is_file() {
                let name = path.strip_prefix(dir).ok().and_then(plain_name);
                files.extend(name.map(|n| (n, path)));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// `relative` as a zip entry's name, if each of its parts is plain.
fn plain_name(relative: &Path) -> Option<String> {
    let name = relative.to_str()?;
    let plain = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    name.split('/').all(plain).then(|| name.to_owned())
}

/// `path` opened without following a link, if it is still a regular file of `owner`'s.
fn open_owned(path: &Path, owner: u32) -> io::Result<Option<File>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    Ok((meta.is_file() && meta.uid() == owner).then_some(file))
}

/// A file that refuses to grow past `max` bytes.
struct Capped {
    file: File,
    max: u64,
}

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let at = self.file.stream_position()?;
        if at + buf.len() as u64 > self.max {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, "over the cap"));
        }
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for Capped {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `ncu --print-details body` report of three kernels, as Nsight prints it.
    const REPORT: &str = "\
[1234] python3.11@127.0.0.1
  custom_kernel(float*, int) (128, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    Table Name : GPU Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Memory Throughput                 %        71.93
    Compute (SM) Throughput           %        12.07

    Table Name : Memory Throughput Breakdown
    L1/TEX Hit Rate                   %        10.00

    Section: Pipe Utilization
    Table Name : Pipe Utilization (% of active cycles)
    FMA                               %        20.10

  reduce_kernel(float*) (64, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Table Name : GPU Throughput
    Memory Throughput                 %        33.00

  third_kernel() (1, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Table Name : GPU Throughput
    Memory Throughput                 %        99.00
";

    #[test]
    fn the_report_keeps_kernelbots_tables_of_the_first_two_kernels() {
        let kept = filter_ncu_report(REPORT);
        assert!(kept.starts_with("  custom_kernel(float*, int)"), "{kept}");
        for line in [
            "Compute (SM) Throughput           %        12.07",
            "FMA",
            "33.00",
        ] {
            assert!(kept.contains(line), "{line} in {kept}");
        }
        for gone in ["L1/TEX Hit Rate", "99.00", "[1234] python"] {
            assert!(!kept.contains(gone), "{gone} in {kept}");
        }
        assert!(
            kept.contains("  third_kernel()"),
            "every kernel's header: {kept}"
        );
        assert!(kept.contains("Additional kernel launches follow"));
    }

    #[test]
    fn a_long_report_is_cut() {
        let long = format!(
            "  k() (1, 1, 1)x(1, 1, 1)\n    Table Name : GPU Throughput\n{}",
            "    Metric                       %        1.0\n".repeat(500)
        );
        let kept = filter_ncu_report(&long);
        assert!(kept.lines().count() < 110, "{}", kept.lines().count());
        assert!(kept.contains("Report has been truncated"));
    }

    #[test]
    fn each_runtime_has_kernelbots_profiler_command() {
        let program = ["python3".to_owned(), "eval.py".to_owned()];
        let ncu = Profiler::for_runtime("CUDA").unwrap().wrap(
            Path::new("/w/p"),
            &ProfileOptions::default(),
            &program,
        );
        assert_eq!(
            ncu.join(" "),
            "ncu --set full --nvtx --nvtx-include custom_kernel/ --import-source 1 -c 10 \
             -o /w/p/profile.ncu-rep -- python3 eval.py"
        );
        let roc = Profiler::for_runtime("ROCm").unwrap().wrap(
            Path::new("/w/p"),
            &ProfileOptions::default(),
            &program,
        );
        assert!(
            roc.join(" ")
                .starts_with("rocprofv3 --log-level fatal --hip-trace")
        );
        assert!(
            roc.join(" ")
                .ends_with("-d /w/p -o %pid% -- python3 eval.py")
        );
        assert_eq!(Profiler::for_runtime(""), None);
        assert_eq!(Profiler::RocProf.tables_command(Path::new("/w")), None);
        assert!(Profiler::RocProf.keeps("_code_object0001.o"));
        for other in ["_code_object0001.so", "eval.py", "_code_object../x.o"] {
            assert!(!Profiler::RocProf.keeps(other), "{other}");
        }
        assert!(!Profiler::NsightCompute.keeps("_code_object0001.o"));
    }

    #[test]
    fn a_zip_holds_only_regular_files_of_the_owner_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("profile_data");
        std::fs::create_dir_all(data.join("sub")).unwrap();
        std::fs::write(data.join("profile.ncu-rep"), b"report").unwrap();
        std::fs::write(data.join("sub/trace.csv"), b"a,b\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", data.join("passwd")).unwrap();
        std::os::unix::fs::symlink("/etc", data.join("etc")).unwrap();
        let owner = std::fs::metadata(&data).unwrap().uid();
        let to = dir.path().join("profile.0.zip");
        let size = zip_dir(&data, owner, &to).unwrap();
        assert_eq!(size, std::fs::metadata(&to).unwrap().len());
        let mut archive = zip::ZipArchive::new(File::open(&to).unwrap()).unwrap();
        let mut names: Vec<String> = archive
            .file_names()
            .map(|n| n.unwrap().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["profile.ncu-rep", "sub/trace.csv"]);
        let mut text = String::new();
        archive
            .by_name("sub/trace.csv")
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "a,b\n");
        // Another owner's directory, or a link in place of the directory, is not read.
        let other = zip_dir(&data, owner + 1, &dir.path().join("none.zip"));
        assert!(matches!(other, Err(ZipError::NotItsDirectory)), "{other:?}");
        let swapped = dir.path().join("swapped");
        std::os::unix::fs::symlink(&data, &swapped).unwrap();
        let linked = zip_dir(&swapped, owner, &dir.path().join("linked.zip"));
        assert!(
            matches!(linked, Err(ZipError::NotItsDirectory)),
            "{linked:?}"
        );
        // An existing target is not overwritten.
        assert!(zip_dir(&data, owner, &to).is_err());
        assert!(to.exists(), "the zip already there stays");
    }

    #[test]
    fn names_that_would_unpack_elsewhere_are_left_out_and_nothing_is_no_zip() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("d");
        std::fs::create_dir(&data).unwrap();
        let owner = std::fs::metadata(&data).unwrap().uid();
        let empty = zip_dir(&data, owner, &dir.path().join("e.zip"));
        assert!(matches!(empty, Err(ZipError::Empty)), "{empty:?}");
        assert!(!dir.path().join("e.zip").exists());
        for name in ["ok.csv", "..\\..\\x.bat", "a b.txt", "über.txt"] {
            std::fs::write(data.join(name), b"x").unwrap();
        }
        let to = dir.path().join("n.zip");
        zip_dir(&data, owner, &to).unwrap();
        let archive = zip::ZipArchive::new(File::open(&to).unwrap()).unwrap();
        let names: Vec<String> = archive
            .file_names()
            .map(|n| n.unwrap().into_owned())
            .collect();
        assert_eq!(names, ["ok.csv"]);
        assert_eq!(
            plain_name(Path::new("sub/trace.csv")).as_deref(),
            Some("sub/trace.csv")
        );
        assert_eq!(plain_name(Path::new("../x")), None);
    }

    #[test]
    fn a_zip_over_the_cap_is_refused_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("d");
        std::fs::create_dir(&data).unwrap();
        // Incompressible: bytes of a simple generator, more than the cap.
        let mut x: u64 = 1;
        let noise: Vec<u8> = (0..(MAX_ZIP_BYTES + 1024 * 1024))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(data.join("big.bin"), noise).unwrap();
        let owner = std::fs::metadata(&data).unwrap().uid();
        let to = dir.path().join("profile.0.zip");
        let err = zip_dir(&data, owner, &to).unwrap_err();
        assert!(matches!(err, ZipError::TooLarge), "{err}");
        assert!(err.to_string().contains("over 64 MiB"));
        assert!(!to.exists());
    }
}
