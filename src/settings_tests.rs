//! Unit tests of `settings` (the shared mechanism through a fake environment, and each
//! setting's values).

use super::*;

/// A setting of a variable no test sets, read through a fake environment.
fn level() -> Setting<u8> {
    Setting::new("DLPACK_MPI_TEST_LEVEL", "low or high", |v| {
        choice(&[("low", 1), ("high", 2)], v)
    })
}

fn env(value: &'static str) -> impl FnOnce(&'static str) -> Option<String> {
    move |name| {
        assert_eq!(name, "DLPACK_MPI_TEST_LEVEL");
        Some(value.to_string())
    }
}

fn unset(_: &'static str) -> Option<String> {
    None
}

fn is_invalid(r: Result<u8>, value: &str) -> bool {
    matches!(r, Err(Error::InvalidSetting { name, value: v, expected })
        if name == "DLPACK_MPI_TEST_LEVEL" && v == value && expected == "low or high")
}

/// Asserts that `read` is [`Error::InvalidSetting`] naming the variable `name` and the
/// (trimmed) value `value`.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(read: Result<T>, name: &str, value: &str) {
    match read {
        Err(Error::InvalidSetting {
            name: n, value: v, ..
        }) => {
            assert_eq!((n, v.as_str()), (name, value));
        }
        other => panic!("{value}: expected InvalidSetting, got {other:?}"),
    }
}

#[test]
fn strict_parse() {
    let s = level();
    assert_eq!(s.parse(None).unwrap(), None);
    assert_eq!(s.parse(Some("  ")).unwrap(), None);
    assert_eq!(s.parse(Some(" HIGH ")).unwrap(), Some(2));
    assert_refused(s.parse(Some(" hihg ")), "DLPACK_MPI_TEST_LEVEL", "hihg");
    // An invalid environment value is an error at every read, never the default.
    let s = level();
    assert!(is_invalid(s.resolve(env("medium"), || 1), "medium"));
    assert!(is_invalid(s.resolve(env("medium"), || 1), "medium"));
}

#[test]
fn unset_is_the_default_computed_once() {
    let s = level();
    assert_eq!(s.resolve(unset, || 1).unwrap(), 1);
    // Kept: neither the default nor the environment is asked again.
    assert_eq!(s.resolve(env("high"), || 2).unwrap(), 1);
    let s = level();
    assert_eq!(s.resolve(env(""), || 2).unwrap(), 2);
    // Through the real environment: the variable is unset in tests.
    assert_eq!(level().get_or(|| 1).unwrap(), 1);
    assert_eq!(level().env_now().unwrap(), None);
}

#[test]
fn environment_is_read_once() {
    let s = level();
    assert_eq!(s.resolve(env("high"), || 1).unwrap(), 2);
    assert_eq!(s.resolve(env("low"), || 1).unwrap(), 2);
}

#[test]
fn setter_wins() {
    // Before the first read: the environment is not consulted.
    let s = level();
    s.set(1);
    assert_eq!(s.resolve(env("high"), || 2).unwrap(), 1);
    // After a read from the environment, and after an invalid one.
    let s = level();
    assert_eq!(s.resolve(env("high"), || 1).unwrap(), 2);
    s.set(1);
    assert_eq!(s.resolve(unset, || 2).unwrap(), 1);
    let s = level();
    assert!(is_invalid(s.resolve(env("x"), || 1), "x"));
    s.set(2);
    assert_eq!(s.resolve(env("x"), || 1).unwrap(), 2);
}

#[test]
fn agreement_values() {
    assert_eq!(parse_agreement(None).unwrap(), None);
    assert_eq!(parse_agreement(Some(" ")).unwrap(), None);
    assert_eq!(
        parse_agreement(Some("Collective")).unwrap(),
        Some(Agreement::Collective)
    );
    assert_eq!(
        parse_agreement(Some(" LOCAL ")).unwrap(),
        Some(Agreement::Local)
    );
    assert_eq!(Agreement::default(), Agreement::Collective);
    for bad in ["locale", "none", "0", "collective,local"] {
        assert_refused(parse_agreement(Some(bad)), AGREEMENT_ENV, bad);
    }
}

#[test]
fn packing_values() {
    assert_eq!(parse_packing(None).unwrap(), None);
    assert_eq!(parse_packing(Some(" ")).unwrap(), None);
    assert_eq!(parse_packing(Some("copy")).unwrap(), Some(Packing::Copy));
    assert_eq!(
        parse_packing(Some("Derived")).unwrap(),
        Some(Packing::DerivedDatatype)
    );
    assert_eq!(parse_packing(Some("AUTO")).unwrap(), Some(Packing::Auto));
    assert_eq!(Packing::default(), Packing::Auto);
    assert_refused(parse_packing(Some("cpoy")), PACKING_ENV, "cpoy");
}

#[test]
fn half_ops_values() {
    assert_eq!(HALF_OPS.parse(None).unwrap(), None);
    assert_eq!(HALF_OPS.parse(Some(" ")).unwrap(), None);
    assert_eq!(HALF_OPS.parse(Some("Auto")).unwrap(), Some(HalfOps::Auto));
    assert_eq!(
        HALF_OPS.parse(Some(" library ")).unwrap(),
        Some(HalfOps::Library)
    );
    assert_eq!(HALF_OPS.parse(Some("MPI")).unwrap(), Some(HalfOps::Mpi));
    assert_eq!(HalfOps::default(), HalfOps::Auto);
    for bad in ["native", "mpich", "lib"] {
        assert_refused(HALF_OPS.parse(Some(bad)), HALF_OPS_ENV, bad);
    }
}

#[test]
fn byte_count_values() {
    assert_eq!(parse_pack_threshold(None).unwrap(), None);
    assert_eq!(parse_pack_threshold(Some("8192")).unwrap(), Some(8192));
    assert_refused(parse_pack_threshold(Some("-1")), PACK_THRESHOLD_ENV, "-1");
    assert_eq!(parse_pool_cap(None).unwrap(), None);
    assert_eq!(parse_pool_cap(Some(" 1024 ")).unwrap(), Some(1024));
    assert_refused(parse_pool_cap(Some("1M")), POOL_CAP_ENV, "1M");
    // Digits only: a sign is refused either way (`+5` was read as 5).
    for bad in ["+5", "-0", " +1 "] {
        assert!(parse_pool_cap(Some(bad)).is_err(), "{bad}");
        assert!(parse_pack_threshold(Some(bad)).is_err(), "{bad}");
    }
}

#[test]
fn default_threshold_per_library() {
    let mpich = "MPICH Version:\t4.0.2\nMPICH Release date: Thu Apr  7 12:34:45 CDT 2022";
    assert_eq!(default_pack_threshold_for(mpich), 64);
    let ompi = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4";
    assert_eq!(default_pack_threshold_for(ompi), 16);
    assert_eq!(default_pack_threshold_for(""), DEFAULT_PACK_THRESHOLD_BYTES);
}

#[test]
fn cuda_aware_values() {
    assert_eq!(parse_cuda_aware(None).unwrap(), None);
    assert_eq!(parse_cuda_aware(Some(" ")).unwrap(), None);
    for yes in ["1", "true", "YES", "On"] {
        assert_eq!(parse_cuda_aware(Some(yes)).unwrap(), Some(true), "{yes}");
    }
    for no in ["0", "false", "No", "OFF"] {
        assert_eq!(parse_cuda_aware(Some(no)).unwrap(), Some(false), "{no}");
    }
    assert_refused(parse_cuda_aware(Some("maybe")), CUDA_AWARE_ENV, "maybe");
}

#[test]
fn device_values() {
    assert_eq!(parse_device_override(None).unwrap(), None);
    assert_eq!(parse_device_override(Some("  ")).unwrap(), None);
    assert_eq!(parse_device_override(Some(" 1 ")).unwrap(), Some(1));
    assert_eq!(parse_device_override(Some("007")).unwrap(), Some(7));
    for bad in ["-1", "+1", "one", "0,1", "1.0", "99999999999", "GPU-1"] {
        assert_refused(parse_device_override(Some(bad)), DEVICE_ENV, bad);
    }
}

#[cfg(feature = "python")]
#[test]
fn exchange_api_values() {
    assert_eq!(
        EXCHANGE_API.parse(Some("Never")).unwrap(),
        Some(ExchangeApi::Never)
    );
    assert_eq!(EXCHANGE_API.parse(Some("")).unwrap(), None);
    assert_refused(
        EXCHANGE_API.parse(Some("always")),
        ExchangeApi::ENV,
        "always",
    );
}

/// The deprecated earlier paths of the settings name the same items and read the same way.
#[test]
#[allow(deprecated)]
fn old_paths_are_the_settings() {
    use crate::{comm, spec::scratch, transport};
    assert_eq!(comm::AGREEMENT_ENV, AGREEMENT_ENV);
    assert_eq!(comm::PACKING_ENV, PACKING_ENV);
    assert_eq!(comm::PACK_THRESHOLD_ENV, PACK_THRESHOLD_ENV);
    assert_eq!(
        comm::DEFAULT_PACK_THRESHOLD_BYTES,
        DEFAULT_PACK_THRESHOLD_BYTES
    );
    assert_eq!(comm::MPICH_PACK_THRESHOLD_BYTES, MPICH_PACK_THRESHOLD_BYTES);
    assert_eq!(comm::ALONE_BYTES, comm::OWN_BUCKET_BYTES);
    let local: comm::Agreement = Agreement::Local;
    assert_eq!(comm::parse_agreement(Some("local")), Ok(Some(local)));
    assert_eq!(
        comm::parse_packing(Some("copy")),
        Ok(Some(comm::Packing::Copy))
    );
    assert_eq!(
        comm::parse_pack_threshold(Some("64")),
        parse_pack_threshold(Some("64"))
    );
    assert_eq!(
        comm::default_pack_threshold_for("MPICH Version: 4.0.2"),
        default_pack_threshold_for("MPICH Version: 4.0.2")
    );
    assert_eq!(transport::CUDA_AWARE_ENV, CUDA_AWARE_ENV);
    assert_eq!(
        transport::parse_override(Some("yes")),
        parse_cuda_aware(Some("yes"))
    );
    assert_eq!(transport::DEVICE_ENV, DEVICE_ENV);
    assert_eq!(transport::parse_device_override(Some("1")), Ok(Some(1)));
    assert_eq!(scratch::POOL_CAP_ENV, POOL_CAP_ENV);
    assert_eq!(scratch::DEFAULT_POOL_CAP_BYTES, DEFAULT_POOL_CAP_BYTES);
    assert_eq!(
        scratch::parse_pool_cap(Some("0")),
        parse_pool_cap(Some("0"))
    );
    #[cfg(feature = "python")]
    {
        let never: crate::python::ExchangeApi = ExchangeApi::Never;
        let _: crate::python::exchange::ExchangeApi = never;
    }
}

/// A misspelt name is unknown, with the known name it was meant for; the settings and the
/// tools' names are known; names without the prefix are not looked at.
#[test]
fn unknown_names_and_the_closest_known() {
    let unknown = unknown_among(
        [
            "DLPACK_MPI_BUCKET_SIZE",
            "DLPACK_MPI_BUCKET_BYTES",
            "DLPACK_MPI_IMPL",
            "DLPACK_MPI_packing",
            "DLPACK_MPI_HALFOPS",
            "DLPACK_MPI_CUDA_AWARENESS",
            "DLPACK_MPI_ZZZZZZZZZZZZ",
            "PATH",
            "DEP_DLPACK_MPI_PYTHON_LIBDIR",
            "dlpack_mpi_packing",
        ]
        .map(String::from),
    );
    let got: Vec<(&str, Option<&str>)> = unknown
        .iter()
        .map(|u| (u.name.as_str(), u.closest))
        .collect();
    assert_eq!(
        got,
        [
            ("DLPACK_MPI_BUCKET_SIZE", Some(BUCKET_ENV)),
            ("DLPACK_MPI_packing", Some(PACKING_ENV)),
            ("DLPACK_MPI_HALFOPS", Some(HALF_OPS_ENV)),
            ("DLPACK_MPI_CUDA_AWARENESS", Some(CUDA_AWARE_ENV)),
            ("DLPACK_MPI_ZZZZZZZZZZZZ", None),
        ]
    );
    assert_eq!(
        unknown[0].to_string(),
        "environment variable DLPACK_MPI_BUCKET_SIZE is not a dlpack-mpi setting (did you \
         mean DLPACK_MPI_BUCKET_BYTES?)"
    );
    assert!(unknown[4]
        .to_string()
        .contains("(the settings are DLPACK_MPI_AGREEMENT, "));
    assert_eq!(
        warning(&unknown[..1]),
        "dlpack-mpi: warning: environment variable DLPACK_MPI_BUCKET_SIZE is not a dlpack-mpi \
         setting (did you mean DLPACK_MPI_BUCKET_BYTES?): ignored \
         (DLPACK_MPI_UNKNOWN_NAMES=ignore silences this warning)"
    );
    for name in SETTING_NAMES.iter().chain(TOOL_NAMES.iter()) {
        assert!(unknown_among([name.to_string()]).is_empty(), "{name}");
    }
}

#[test]
fn unknown_names_values() {
    assert_eq!(
        UNKNOWN_NAMES.parse(Some(" Ignore ")).unwrap(),
        Some(UnknownNames::Ignore)
    );
    assert_eq!(UnknownNames::default(), UnknownNames::Warn);
    assert_refused(UNKNOWN_NAMES.parse(Some("off")), UNKNOWN_NAMES_ENV, "off");
}

/// Every `DLPACK_MPI_*` name the project's own files use (its scripts, tests, sources,
/// benches, examples, build script) is a setting or one of [`TOOL_NAMES`], so that none of
/// them is reported as unknown: those that are no environment variable are listed here.
#[test]
fn every_name_the_project_uses_is_known() {
    /// Not environment variables: the C shim's stringizing macros, this file's fake setting,
    /// and the misspelling the CLI's tests and the docs use on purpose.
    const NOT_VARIABLES: [&str; 4] = [
        "DLPACK_MPI_STR",
        "DLPACK_MPI_STR2",
        "DLPACK_MPI_TEST_LEVEL",
        "DLPACK_MPI_BUCKET_SIZE",
    ];
    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| {
                ["rs", "sh", "py", "c", "toml"].contains(&e.to_str().unwrap_or(""))
            }) {
                out.push(path);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = vec![root.join("build.rs")];
    for dir in ["scripts", "tests", "src", "benches", "examples", ".ci"] {
        files(&root.join(dir), &mut all);
    }
    let this = root.join("src").join("settings_tests.rs");
    let mut seen = 0;
    for path in all.iter().filter(|p| **p != this) {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for (at, _) in text.match_indices(PREFIX) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue; // DEP_DLPACK_MPI_…, a longer name
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.len() == PREFIX.len() || NOT_VARIABLES.contains(&name.as_str()) {
                continue; // `DLPACK_MPI_*` in a comment
            }
            seen += 1;
            assert!(
                unknown_among([name.clone()]).is_empty(),
                "{}: {name} is neither a setting nor in settings::TOOL_NAMES",
                path.display()
            );
        }
    }
    assert!(seen > 100, "{seen} names found: the scan missed the files");
}
