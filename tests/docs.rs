//! The documentation as a user reads it: every `rust` block of the README and of the guide under
//! `docs/` compiles (it appears verbatim in `examples/readme.rs` or in the `guide` example's
//! files, one module per page under `examples/guide/`, which `cargo test` builds), every
//! relative link and `#anchor` resolves inside the repository, and nothing in the repository
//! points at files outside it.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files a user reads: the README, the changelog, and everything under `docs/`.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md"), repo().join("CHANGELOG.md")];
    let mut dirs = vec![repo().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The bodies of the fenced blocks of `lang` in `text`.
fn fenced_blocks<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let open = format!("```{lang}\n");
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&open) {
        let body = &rest[start + open.len()..];
        let end = body.find("```").expect("an unterminated code block");
        blocks.push(&body[..end]);
        rest = &body[end + 3..];
    }
    blocks
}

/// `text` without its fenced code blocks and inline code spans (links there are not links).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// The targets of the inline links `[text](target)` in `text`.
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchors for the headings of a Markdown file.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut out = BTreeSet::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        if in_fence || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while !seen.insert(unique.clone()) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        out.insert(unique);
    }
    out
}

/// What is wrong with the link `target` in `file`, if anything.
fn broken(file: &Path, target: &str) -> Option<String> {
    if target.starts_with("http://")
        || target.starts_with("https://")
        || target.starts_with("mailto:")
    {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().unwrap().join(path)
    };
    // Normalize without touching the filesystem, so a path through `..` that leaves the
    // repository is caught even when it exists on this machine.
    let mut normal = PathBuf::new();
    for c in resolved.components() {
        match c {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            c => normal.push(c),
        }
    }
    if !normal.starts_with(repo()) {
        return Some("points outside the repository".into());
    }
    if !normal.exists() {
        return Some("no such file".into());
    }
    if let Some(anchor) = anchor
        && normal.extension().is_some_and(|e| e == "md")
    {
        let text = std::fs::read_to_string(&normal).unwrap();
        if !anchors(&text).contains(anchor) {
            return Some(format!("no heading with anchor #{anchor}"));
        }
    }
    None
}

#[test]
fn every_link_in_the_docs_resolves_inside_the_repository() {
    let mut problems = Vec::new();
    let mut links = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for target in link_targets(&text) {
            links += 1;
            if let Some(why) = broken(&file, &target) {
                let shown = file.strip_prefix(repo()).unwrap().display();
                problems.push(format!("{shown}: ({target}): {why}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
    assert!(
        links > 30,
        "found only {links} links: is the parser broken?"
    );
}

#[test]
fn every_rust_snippet_of_the_docs_is_in_a_compiled_example() {
    let lines_of = |path: &Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| l.trim().to_string())
            .collect()
    };
    let readme_example = lines_of(&repo().join("examples/readme.rs"));
    // The guide's example: its `main.rs` and one module per page (a snippet lies within one).
    let mut guide_files: Vec<PathBuf> = std::fs::read_dir(repo().join("examples/guide"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    guide_files.sort();
    let guide_examples: Vec<Vec<String>> = guide_files.iter().map(|f| lines_of(f)).collect();
    let mut missing = Vec::new();
    let mut blocks = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let shown = file.strip_prefix(repo()).unwrap().display().to_string();
        let (compiled, in_file) = if shown == "README.md" {
            (std::slice::from_ref(&readme_example), "examples/readme.rs")
        } else {
            (guide_examples.as_slice(), "examples/guide/")
        };
        for body in fenced_blocks(&text, "rust") {
            blocks += 1;
            let lines: Vec<String> = body.lines().map(|l| l.trim().to_string()).collect();
            let found = compiled
                .iter()
                .any(|file| file.windows(lines.len()).any(|w| w == lines.as_slice()));
            if !found {
                missing.push(format!(
                    "{shown}: this snippet is not in {in_file} (copy it there, verbatim):\n{body}"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    assert!(blocks >= 3, "found only {blocks} rust blocks");
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    assert!(
        lines.len() <= 250,
        "README.md has {} lines (at most 250)",
        lines.len()
    );
    let toml = lines.iter().position(|l| l.starts_with("```toml"));
    assert!(
        toml.is_some_and(|at| at < 60),
        "the Cargo.toml lines are not within the README's first 60 lines"
    );
}

#[test]
fn nothing_points_outside_the_repository() {
    // Earlier docs pointed at a design note beside the checkout (built here so that this file
    // does not match itself).
    let beside = ["..", "/shared/"].concat();
    let design = ["shared/", "DESIGN.md"].concat();
    let mut hits = Vec::new();
    let mut dirs = vec![repo().to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "runs" {
                    dirs.push(path);
                }
                continue;
            }
            let text_file = ["rs", "md", "toml", "sh"]
                .iter()
                .any(|e| path.extension().is_some_and(|x| x == *e));
            if !text_file || path.ends_with("docs/perf/HISTORY.md") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.contains(&beside) || line.contains(&design) {
                    hits.push(format!("{}:{}: {line}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "references outside the repository:\n{}",
        hits.join("\n")
    );
}
