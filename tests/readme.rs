//! Every `rust` block of the README appears verbatim in `examples/readme.rs`, which `cargo test`
//! builds: the README's library snippets compile against the current API.

#[test]
fn every_readme_snippet_is_in_the_compiled_example() {
    let readme = include_str!("../README.md");
    let example: Vec<&str> = include_str!("../examples/readme.rs")
        .lines()
        .map(str::trim)
        .collect();
    let mut blocks = 0;
    let mut rest = readme;
    while let Some(start) = rest.find("```rust\n") {
        let body = &rest[start + "```rust\n".len()..];
        let end = body
            .find("```")
            .expect("an unterminated rust block in the README");
        let lines: Vec<&str> = body[..end].lines().map(str::trim).collect();
        assert!(
            example.windows(lines.len()).any(|w| w == lines.as_slice()),
            "this README snippet is not in examples/readme.rs (copy it there, verbatim):\n{}",
            &body[..end]
        );
        blocks += 1;
        rest = &body[end + 3..];
    }
    assert!(blocks >= 5, "found only {blocks} rust blocks in the README");
}
