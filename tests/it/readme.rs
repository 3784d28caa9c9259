//! `examples/readme.rs` is the README's example, which `scripts/expand-size.sh` measures:
//! the two must not drift apart (the README's copy runs as a doc test).

/// The code without comment lines, whitespace and trailing commas: rustfmt lays it out
/// differently from the README.
fn code(text: &str) -> String {
    let tight: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    tight
        .replace(",}", "}")
        .replace(",)", ")")
        .replace(",]", "]")
}

#[test]
fn the_readme_example_is_examples_readme_rs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example = std::fs::read_to_string(format!("{root}/examples/readme.rs")).unwrap();
    let block = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README has a Rust example");
    assert_eq!(code(block), code(&example));
}
