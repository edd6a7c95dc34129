//! The repository stands alone: nothing in it points to files outside it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::root;

/// Files to scan: what git tracks, or (outside a git checkout) every file below the
/// root except build output and hidden directories.
fn files(root: &Path) -> Vec<PathBuf> {
    let tracked = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty());
    if let Some(o) = tracked {
        return o
            .stdout
            .split(|&b| b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| root.join(String::from_utf8_lossy(name).as_ref()))
            .collect();
    }
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                if !name.starts_with('.') && name != "target" || name == ".ci" {
                    dirs.push(path);
                }
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// No tracked text file (code, tests, docs, examples, CI) refers to the `shared`
/// directory beside the developers' checkout or to paths under `/work`: reference
/// material that a clone does not have.
#[test]
fn no_file_refers_outside_the_repository() {
    let root = root();
    // Built here so that this file does not contain them.
    let needles = [format!("..{}shared", '/'), format!("{}work{}", '/', '/')];
    let mut found = Vec::new();
    let files = files(&root);
    assert!(
        files.len() > 50,
        "only {} files under {}",
        files.len(),
        root.display()
    );
    for path in files {
        let Ok(bytes) = std::fs::read(&path) else {
            continue; // deleted in the working tree
        };
        if bytes.contains(&0) {
            continue; // binary (snapshot pickles)
        }
        let text = String::from_utf8_lossy(&bytes);
        for (n, line) in text.lines().enumerate() {
            if needles.iter().any(|needle| line.contains(needle.as_str())) {
                let rel = path.strip_prefix(&root).unwrap_or(&path);
                found.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "references outside the repository:\n{}",
        found.join("\n")
    );
}
