//! The layering of `src/comm` (docs/ARCHITECTURE.md, "Modules", the `comm` row), checked on the
//! source text: a file of `src/comm/engine` uses only files of its own layer or lower ones and
//! never an operation of `src/comm/ops` or the public trait above them; the nonblocking driver
//! names no request type; the file of the one MPI call names no fused type; the operations take
//! the sealed endpoint, not `TensorComm`. A `use` or path that breaks the order fails here,
//! naming the file and the line.

use std::fs;
use std::path::Path;

/// The layer of each file of `src/comm/engine` (lowest first).
const ENGINE: &[(&str, u8)] = &[
    ("progress", 1),
    ("ledger", 1),
    ("diagnosis", 1),
    ("signature", 1),
    ("checks", 1),
    ("packing", 1),
    ("blocks", 1),
    ("bcast", 1),
    ("halfops", 1),
    ("snapshot", 1),
    ("agree", 2),
    ("call", 2),
    ("stager", 2),
    ("operands", 2),
    ("held", 2),
    ("mode", 3),
    ("pending", 4),
    ("request", 5),
    ("plan", 5),
    ("exchange", 5),
];

/// The code of `path` without comments (line comments and doc comments), line by line; a
/// `use` spread over several lines is joined into its first line.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines: Vec<(usize, String)> = Vec::new();
    let mut open_use = false;
    for (i, l) in text.lines().enumerate() {
        let code = l.split("//").next().unwrap_or("").trim_end().to_string();
        if code.trim().is_empty() {
            continue;
        }
        match lines.last_mut() {
            Some((_, last)) if open_use => last.push_str(code.trim()),
            _ => lines.push((i + 1, code.clone())),
        }
        if code.trim_start().starts_with("use ")
            || code.trim_start().starts_with("pub") && code.contains(" use ")
        {
            open_use = true;
        }
        if code.trim_end().ends_with(';') {
            open_use = false;
        }
    }
    lines
}

/// The engine files `line` names: the first segment after each `super::` or `engine::`,
/// or each first segment inside `super::{…}` (one line of a `use`).
fn engine_names(line: &str) -> Vec<&'static str> {
    let mut named = Vec::new();
    for prefix in ["super::", "engine::"] {
        for (at, _) in line.match_indices(prefix) {
            let rest = &line[at + prefix.len()..];
            let segments: Vec<&str> = match rest.strip_prefix('{') {
                Some(inner) => inner
                    .split('}')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .split("::")
                            .next()
                            .unwrap_or("")
                            .split(' ')
                            .next()
                            .unwrap_or("")
                    })
                    .collect(),
                None => vec![rest
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or("")],
            };
            for seg in segments {
                if let Some((name, _)) = ENGINE.iter().find(|(n, _)| *n == seg) {
                    named.push(*name);
                }
            }
        }
    }
    named
}

fn engine_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/comm/engine")
}

#[test]
fn every_engine_file_has_a_layer() {
    for entry in fs::read_dir(engine_dir()).expect("src/comm/engine") {
        let name = entry
            .expect("entry")
            .file_name()
            .into_string()
            .expect("UTF-8");
        let stem = name.trim_end_matches(".rs");
        assert!(
            stem == "mod" || ENGINE.iter().any(|(n, _)| *n == stem),
            "src/comm/engine/{name} has no layer in tests/layers.rs (and docs/ARCHITECTURE.md)"
        );
    }
}

#[test]
fn engine_files_use_only_their_layer_or_lower_ones() {
    let mut broken = Vec::new();
    for &(file, layer) in ENGINE {
        let path = engine_dir().join(format!("{file}.rs"));
        for (n, line) in code_lines(&path) {
            for used in engine_names(&line) {
                let used_layer = ENGINE.iter().find(|(f, _)| *f == used).map_or(0, |e| e.1);
                if used_layer > layer {
                    broken.push(format!(
                        "engine/{file}.rs:{n} (layer {layer}) uses {used} (layer {used_layer})"
                    ));
                }
            }
            for word in ["ops::", "TensorComm", "crate::transport"] {
                if line.contains(word) && !line.contains("halfops::") {
                    broken.push(format!("engine/{file}.rs:{n} names `{word}`"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

#[test]
fn the_driver_names_no_request_and_the_call_file_no_fused_type() {
    let rules = [
        ("pending", ["TensorRequest", "request::"]),
        ("call", ["Fused", "fused::"]),
        ("progress", ["Collective", "Operation"]),
    ];
    for (file, words) in rules {
        for (n, line) in code_lines(&engine_dir().join(format!("{file}.rs"))) {
            for word in words {
                assert!(
                    !line.contains(word),
                    "engine/{file}.rs:{n} names `{word}`: {line}"
                );
            }
        }
    }
}

#[test]
fn operations_take_the_endpoint_not_the_public_trait() {
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/comm/ops");
    let mut files = vec![];
    let mut dirs = vec![ops];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d)
            .expect("ops")
            .map(|e| e.expect("entry").path())
        {
            if e.is_dir() {
                dirs.push(e);
            } else {
                files.push(e);
            }
        }
    }
    assert!(
        files.len() >= 6,
        "src/comm/ops holds the operations: {files:?}"
    );
    for f in files {
        for (n, line) in code_lines(&f) {
            assert!(
                !line.contains("TensorComm") && !line.contains("pending::"),
                "{}:{n} names the public trait or the nonblocking driver: {line}",
                f.display()
            );
        }
    }
}
