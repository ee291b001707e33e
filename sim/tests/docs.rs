//! The documentation's links resolve: every relative link in the README, `docs/` and
//! `reports/` names a file or directory that exists, and every `#fragment` into a markdown
//! file names one of its headings (GitHub's anchors). And the README stays a front door.
//!
//! The links of the generated scoreboard (`reports/mutants.md`) into `failures/` are
//! skipped: the scoreboard's failure files are written under the report dir by
//! `palisade mutants` and are not tracked.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The README is the front door; everything else goes to `docs/` (issue 26).
const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The markdown files whose links are checked, relative to the root.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![
        PathBuf::from("README.md"),
        PathBuf::from("fuzz/README.md"),
        PathBuf::from("reports/regressions/found/README.md"),
    ];
    for dir in ["docs", "reports"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .expect("read dir")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .map(|p| p.strip_prefix(root).expect("under root").to_path_buf())
            .collect();
        found.sort();
        pages.extend(found);
    }
    pages
}

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_` kept, spaces
/// to `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (a repeated heading gets `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = BTreeSet::new();
    for line in prose(text).lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor.clone());
        out.insert(anchor);
    }
    out
}

/// The targets of the inline links `[text](target)` in the prose.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find([')', ' ', '\n']).unwrap_or(rest.len());
        out.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    out
}

/// `base/target` with `.` and `..` resolved, or `None` when it leaves the root.
fn resolve(base: &Path, target: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in base.join(target).components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages(&root) {
        let text = std::fs::read_to_string(root.join(&page)).expect("read page");
        let dir = page.parent().expect("a page has a directory");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((link.as_str(), ""));
            if page == Path::new("reports/mutants.md") && path.starts_with("failures/") {
                continue;
            }
            checked += 1;
            let target = if path.is_empty() {
                Some(page.clone())
            } else {
                resolve(dir, path)
            };
            let Some(target) = target.filter(|t| root.join(t).exists()) else {
                broken.push(format!("{}: {link}: no such file", page.display()));
                continue;
            };
            if !fragment.is_empty() && target.extension().is_some_and(|x| x == "md") {
                let text = std::fs::read_to_string(root.join(&target)).expect("read target");
                if !anchors(&text).contains(fragment) {
                    broken.push(format!("{}: {link}: no such heading", page.display()));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the scan broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_sees_a_broken_link_and_a_missing_heading() {
    let text =
        "# The `b` thing — again\n```\n[in](a fence)\n```\n[x](a.md#the-b-thing--again) [y](b.md)";
    assert_eq!(links(text), ["a.md#the-b-thing--again", "b.md"]);
    assert!(anchors(text).contains("the-b-thing--again"));
    assert!(!anchors(text).contains("the-b-thing"));
    assert_eq!(
        resolve(Path::new("docs"), "../reports/x.md"),
        Some(PathBuf::from("reports/x.md"))
    );
    assert_eq!(resolve(Path::new("docs"), "../../x.md"), None);
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; at most {README_MAX_LINES}: move detail to docs/"
    );
    for command in [
        "cargo run --release -p palisade-sim --bin palisade -- sweep",
        "cargo test --workspace --release",
    ] {
        assert!(readme.contains(command), "README.md lacks {command:?}");
    }
}
