//! Whether this process can open the CUDA driver and NCCL.
//!
//! cudarc (with `dynamic-loading`) opens each library on its first call into it and panics
//! if it cannot, so every entry point of the backend asks [`require_cuda`] or
//! [`require_nccl`] first and gets [`Error::LibraryMissing`] instead of a panic.
//!
//! cudarc looks for NCCL as `libnccl.so` (and a few versioned names), never as its soname
//! `libnccl.so.2`: the only name NCCL's runtime package (Debian/Ubuntu `libnccl2`) and the
//! `nvidia-nccl-cu12` wheel install. Its library handle is private and the dynamic loader
//! reads `LD_LIBRARY_PATH` only when a process starts, so that cannot be fixed from in
//! here; [`require_nccl`] recognises the case and says which link to make.

use std::ffi::c_int;
use std::sync::OnceLock;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::CUresult;

use super::errors::driver_error;
use crate::Error;

const CUDA_LIBRARY: &str = "the CUDA driver (libcuda)";
const NCCL_LIBRARY: &str = "NCCL (libnccl)";
/// The soname every NCCL 2 package installs, and a name cudarc does not try.
const NCCL_SONAME: &str = "libnccl.so.2";
/// Where the hints put the `libnccl.so` link; the commands double-quote it so `$HOME`
/// expands.
const LINK_DIR: &str = "$HOME/.local/lib/actorgraph-nccl";

/// The version of the NCCL library this process opens, as (major, minor, patch).
///
/// Returns [`Error::LibraryMissing`] if NCCL cannot be opened (see the error's hint for the
/// fix), and [`Error::Gpu`] if NCCL cannot tell its version.
pub fn nccl_version() -> Result<(u32, u32, u32), Error> {
    require_nccl()?;
    let code = cudarc::nccl::result::get_nccl_version().map_err(|e| Error::Gpu {
        call: "ncclGetVersion",
        // cudarc's `NcclError` prints no detail; the result code's name is the detail.
        message: format!("{:?}", e.0),
    })?;
    decode_version(code).ok_or_else(|| Error::Gpu {
        call: "ncclGetVersion",
        message: format!("returned an invalid version code {code}"),
    })
}

/// The number of GPUs the CUDA driver reports.
///
/// Returns [`Error::LibraryMissing`] if the driver cannot be opened, `Ok(0)` if it is
/// installed but sees no GPU, and [`Error::Gpu`] if it fails otherwise.
pub fn device_count() -> Result<usize, Error> {
    require_cuda()?;
    match cudarc::driver::result::init() {
        Ok(()) => {}
        // A driver without devices (a host or container with no GPU attached) answers the
        // question: there are none.
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => return Ok(0),
        Err(e) => return Err(driver_error("cuInit", e)),
    }
    let count = cudarc::driver::result::device::get_count()
        .map_err(|e| driver_error("cuDeviceGetCount", e))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// `Ok` if cudarc can open the CUDA driver, else [`Error::LibraryMissing`].
pub(crate) fn require_cuda() -> Result<(), Error> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: opening a library runs its initialisers. This tries exactly the names cudarc
    // opens on its first driver call, so it runs nothing that call would not.
    if *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() }) {
        return Ok(());
    }
    Err(Error::LibraryMissing {
        library: CUDA_LIBRARY,
        searched: cuda_candidates(),
        hint: "install the NVIDIA driver, which provides libcuda.so.1; in a container, \
               start it with the GPUs and driver mounted (e.g. `docker run --gpus all`)"
            .to_string(),
    })
}

/// `Ok` if cudarc can open NCCL, else [`Error::LibraryMissing`] whose hint says how to fix
/// it: the link to make when only `libnccl.so.2` is installed, or what to install.
pub(crate) fn require_nccl() -> Result<(), Error> {
    static PROBE: OnceLock<NcclProbe> = OnceLock::new();
    let hint = match PROBE.get_or_init(probe_nccl) {
        NcclProbe::Found => return Ok(()),
        NcclProbe::SonameOnly(path) => soname_hint(path.as_deref()),
        NcclProbe::Absent => install_hint(),
    };
    Err(Error::LibraryMissing {
        library: NCCL_LIBRARY,
        searched: nccl_candidates(),
        hint,
    })
}

/// What the NCCL probe found. Kept instead of the error, which is not `Clone`.
enum NcclProbe {
    /// cudarc opens NCCL.
    Found,
    /// Only `libnccl.so.2` opens; the file it was, if the process maps show it.
    SonameOnly(Option<String>),
    /// Neither opens.
    Absent,
}

fn probe_nccl() -> NcclProbe {
    // SAFETY: opening a library runs its initialisers. This tries exactly the names cudarc
    // opens on its first NCCL call, so it runs nothing that call would not.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        return NcclProbe::Found;
    }
    // SAFETY: as above: this is the NCCL runtime that cudarc would open had it tried this
    // name, and the file the hint tells the user to make cudarc open.
    match unsafe { libloading::Library::new(NCCL_SONAME) } {
        Ok(lib) => {
            // The loader searched LD_LIBRARY_PATH, its cache and the default directories;
            // where it found the file is only visible in the process's mappings, read
            // while the library is still open.
            let path = std::fs::read_to_string("/proc/self/maps")
                .ok()
                .and_then(|maps| mapped_path(&maps, "libnccl.so").map(str::to_owned));
            drop(lib);
            NcclProbe::SonameOnly(path)
        }
        Err(_) => NcclProbe::Absent,
    }
}

/// The path of the first mapped file whose name starts with `prefix`, from the text of
/// `/proc/self/maps` (fields: address, perms, offset, device, inode, path).
fn mapped_path<'a>(maps: &'a str, prefix: &str) -> Option<&'a str> {
    maps.lines()
        // Only the path field can hold a '/'; it runs to the end of the line.
        .filter_map(|line| line.find('/').map(|at| line[at..].trim_end()))
        .find(|path| {
            std::path::Path::new(path)
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(prefix))
        })
}

/// Decodes `ncclGetVersion`'s code: `major*10000 + minor*100 + patch` since NCCL 2.9,
/// `major*1000 + minor*100 + patch` before.
fn decode_version(code: c_int) -> Option<(u32, u32, u32)> {
    let code = u32::try_from(code).ok().filter(|&c| c > 0)?;
    let major_unit = if code >= 10_000 { 10_000 } else { 1_000 };
    Some((code / major_unit, (code % major_unit) / 100, code % 100))
}

fn cuda_candidates() -> Vec<String> {
    // The names `cudarc::driver::sys::is_culib_present` tries, in its order.
    let mut names = cudarc::get_lib_name_candidates("cuda");
    names.extend(cudarc::get_lib_name_candidates("nvcuda"));
    dedup(names)
}

fn nccl_candidates() -> Vec<String> {
    let mut names = cudarc::get_lib_name_candidates("nccl");
    names.push(NCCL_SONAME.to_string());
    dedup(names)
}

/// `names` without repeats, in order: cudarc's list repeats some names (e.g.
/// `libnccl.so.12`), which would only lengthen the error.
fn dedup(names: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    names
        .into_iter()
        .filter(|n| seen.insert(n.clone()))
        .collect()
}

/// The hint when only `libnccl.so.2` opens: link it as `libnccl.so`.
fn soname_hint(found: Option<&str>) -> String {
    let (target, found) = match found {
        Some(path) => (shell_quote(path), format!("NCCL was found as `{path}`")),
        None => (
            "/path/to/libnccl.so.2".to_string(),
            "NCCL was found (`ldconfig -p | grep libnccl` or LD_LIBRARY_PATH shows where)"
                .to_string(),
        ),
    };
    format!(
        "{found}, under its soname {NCCL_SONAME} only, but cudarc only opens it as \
         `libnccl.so`, the link NCCL's development package adds. Install that package \
         (Debian/Ubuntu: `sudo apt install libnccl-dev`), or make the link \
         libnccl.so -> {target} in a directory of its own and put that directory on \
         LD_LIBRARY_PATH before starting the program (the loader reads it only at start):\n{}",
        link_commands(&target)
    )
}

/// The hint when no NCCL opens: what to install.
fn install_hint() -> String {
    format!(
        "install NCCL 2 with its `libnccl.so` link: on Debian/Ubuntu (NVIDIA's CUDA \
         repository), `sudo apt install libnccl2 libnccl-dev`. The `nvidia-nccl-cu12` wheel \
         (`pip install nvidia-nccl-cu12`) ships only libnccl.so.2, which cudarc does not \
         open: link it as libnccl.so and put the link on LD_LIBRARY_PATH before starting \
         the program:\n{}\nIf NCCL is installed in a directory the loader does not search, \
         add that directory to LD_LIBRARY_PATH.",
        link_commands(
            "\"$(python3 -c 'import nvidia.nccl; print(nvidia.nccl.__path__[0])')/lib/libnccl.so.2\""
        )
    )
}

/// Shell commands that link `target` (already quoted for the shell) as `libnccl.so` in
/// [`LINK_DIR`] and put that directory on `LD_LIBRARY_PATH`.
fn link_commands(target: &str) -> String {
    format!(
        "    mkdir -p \"{LINK_DIR}\"\n    \
         ln -sf {target} \"{LINK_DIR}/libnccl.so\"\n    \
         export LD_LIBRARY_PATH=\"{LINK_DIR}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\""
    )
}

/// `s` as one shell word: unchanged if it needs no quoting, else in single quotes.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:=@%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_in_both_encodings() {
        assert_eq!(decode_version(22304), Some((2, 23, 4)));
        assert_eq!(decode_version(21803), Some((2, 18, 3)));
        assert_eq!(decode_version(20900), Some((2, 9, 0)));
        // Before NCCL 2.9 the major version was multiplied by 1000.
        assert_eq!(decode_version(2708), Some((2, 7, 8)));
        assert_eq!(decode_version(0), None);
        assert_eq!(decode_version(-1), None);
    }

    #[test]
    fn mapped_path_finds_the_library_in_proc_maps() {
        let maps = "\
55d0c0a00000-55d0c0a2e000 r--p 00000000 08:01 1234   /usr/bin/prog
7f0000000000-7f0000001000 r--p 00000000 08:01 42     /opt/my libs/libnccl.so.2
7f0000001000-7f0000002000 r-xp 00001000 08:01 42     /opt/my libs/libnccl.so.2
7f0000003000-7f0000004000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0      [stack]
";
        assert_eq!(
            mapped_path(maps, "libnccl.so"),
            Some("/opt/my libs/libnccl.so.2")
        );
        assert_eq!(mapped_path(maps, "libcuda.so"), None);
        // A directory named like the library does not count.
        let dir_only = "7f00-7f01 r--p 00000000 08:01 7 /x/libnccl.so.d/other.so\n";
        assert_eq!(mapped_path(dir_only, "libnccl.so"), None);
    }

    #[test]
    fn soname_hint_gives_the_link_commands_for_the_found_file() {
        let hint = soname_hint(Some("/usr/lib/x86_64-linux-gnu/libnccl.so.2"));
        assert!(hint.contains("libnccl.so -> /usr/lib/x86_64-linux-gnu/libnccl.so.2"));
        assert!(hint.contains(
            "ln -sf /usr/lib/x86_64-linux-gnu/libnccl.so.2 \
             \"$HOME/.local/lib/actorgraph-nccl/libnccl.so\""
        ));
        assert!(hint.contains("mkdir -p \"$HOME/.local/lib/actorgraph-nccl\""));
        assert!(hint.contains(
            "export LD_LIBRARY_PATH=\"$HOME/.local/lib/actorgraph-nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\""
        ));
        assert!(hint.contains("libnccl-dev"));

        let quoted = soname_hint(Some("/opt/it's here/libnccl.so.2"));
        assert!(quoted.contains(r"ln -sf '/opt/it'\''s here/libnccl.so.2' "));

        let unknown = soname_hint(None);
        assert!(unknown.contains("ln -sf /path/to/libnccl.so.2 "));
    }

    #[test]
    fn install_hint_names_the_packages_and_the_wheel_fix() {
        let hint = install_hint();
        assert!(hint.contains("apt install libnccl2 libnccl-dev"));
        assert!(hint.contains("pip install nvidia-nccl-cu12"));
        assert!(
            hint.contains("/lib/libnccl.so.2\" \"$HOME/.local/lib/actorgraph-nccl/libnccl.so\"")
        );
        assert!(hint.contains("export LD_LIBRARY_PATH="));
    }

    #[test]
    fn shell_quote_leaves_plain_paths_alone() {
        assert_eq!(shell_quote("/a/b-c_d.so.2"), "/a/b-c_d.so.2");
        assert_eq!(shell_quote("/a b"), "'/a b'");
        assert_eq!(shell_quote("$x"), "'$x'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn nccl_is_looked_for_under_cudarcs_names_and_its_soname() {
        let names = nccl_candidates();
        assert_eq!(names.first().map(String::as_str), Some("libnccl.so"));
        assert_eq!(names.last().map(String::as_str), Some("libnccl.so.2"));
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    #[test]
    fn missing_libraries_are_errors_not_panics() {
        // Whatever this machine has, the probes answer instead of panicking, and agree with
        // cudarc's own check.
        // SAFETY: the libraries cudarc itself would open; see `require_nccl`.
        let nccl_present = unsafe { cudarc::nccl::sys::is_culib_present() };
        match require_nccl() {
            Ok(()) => assert!(nccl_present),
            Err(Error::LibraryMissing {
                library, searched, ..
            }) => {
                assert!(!nccl_present);
                assert_eq!(library, NCCL_LIBRARY);
                assert_eq!(searched, nccl_candidates());
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        // SAFETY: as above.
        let cuda_present = unsafe { cudarc::driver::sys::is_culib_present() };
        match require_cuda() {
            Ok(()) => assert!(cuda_present),
            Err(Error::LibraryMissing { library, .. }) => {
                assert!(!cuda_present);
                assert_eq!(library, CUDA_LIBRARY);
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}
