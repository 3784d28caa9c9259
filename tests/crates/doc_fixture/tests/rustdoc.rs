//! What `cargo doc` of a user's crate shows of its graphs: each generated item in the
//! user's words (the graph's doc comment, its groups' and inputs' types, one rank's output
//! as the alias `<Graph>Output` with a line saying which method makes each part), and none
//! of the graphs' plumbing (the `Checked`/`MethodCall` impls, whose associated types rustdoc
//! would print with the whole `graph!` source, projections, `__` names).
//!
//! It documents this package with `cargo doc --no-deps` in the workspace's target
//! directory, where the workspace's builds have already checked the dependencies, and reads
//! the text of the HTML pages: only the fixture itself is documented again.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The fixture's doc directory, documented once for all the tests.
fn docs() -> &'static PathBuf {
    static DOCS: OnceLock<PathBuf> = OnceLock::new();
    DOCS.get_or_init(|| {
        // `<target>/tmp`: the target directory of the build that made this test.
        let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target directory")
            .to_path_buf();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args([
                "doc",
                "--no-deps",
                "--offline",
                "-p",
                env!("CARGO_PKG_NAME"),
            ])
            .arg("--target-dir")
            .arg(&target)
            // Every intra-doc link of the generated docs resolves.
            .env("RUSTDOCFLAGS", "-D warnings")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo runs");
        assert!(
            out.status.success(),
            "cargo doc failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target
            .join("doc")
            .join(env!("CARGO_PKG_NAME").replace('-', "_"))
    })
}

/// The text of a page, as a reader sees it: tags and scripts dropped, entities decoded,
/// rustdoc's typographic apostrophe made plain, runs of whitespace one space.
fn page(name: &str) -> String {
    let html = std::fs::read_to_string(docs().join(name)).expect("rustdoc wrote the page");
    let mut text = String::new();
    let mut rest = html.as_str();
    while let Some(open) = rest.find('<') {
        text.push_str(&rest[..open]);
        text.push(' ');
        rest = &rest[open..];
        let end = if rest.starts_with("<script") {
            rest.find("</script>").map(|i| i + "</script>".len())
        } else {
            rest.find('>').map(|i| i + 1)
        };
        rest = &rest[end.unwrap_or(rest.len())..];
    }
    text.push_str(rest);
    let text = text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
        .replace('\u{2019}', "'");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `text` shows `words` (a signature, a sentence), however rustdoc breaks them
/// into lines and tags: compared without whitespace, and without the comma rustdoc puts
/// after the last parameter of a signature it writes one parameter a line.
fn shows(text: &str, words: &str) -> bool {
    let squeeze = |s: &str| s.split_whitespace().collect::<String>().replace(",)", ")");
    squeeze(text).contains(&squeeze(words))
}

/// What no page of a user's crate shows: the graphs' plumbing.
fn assert_no_plumbing(name: &str, text: &str) {
    for noise in [
        "__",
        "graph! {",
        "Checked<",
        "MethodCall<",
        "Signature<",
        "Valid<",
        "Sendable",
        "'__",
    ] {
        assert!(!text.contains(noise), "{name} shows `{noise}`:\n{text}");
    }
}

#[test]
fn execute_returns_the_documented_output_alias() {
    let text = page("struct.Bucketed.html");
    assert_no_plumbing("Bucketed", &text);
    assert!(shows(
        &text,
        "Both outputs of every worker, summed across workers by one collective."
    ));
    assert!(shows(
        &text,
        "pub fn execute(&mut self, x: Tensor<f32>) -> Result<Vec<BucketedOutput>, Error>"
    ));
    assert!(shows(
        &text,
        "returns one BucketedOutput per rank: \
         (the allreduce of comp1's output, the allreduce of comp2's output)."
    ));
    assert!(shows(
        &text,
        "pub fn wait(&mut self, ticket: Ticket) -> Result<Vec<BucketedOutput>, Error>"
    ));

    let alias = page("type.BucketedOutput.html");
    assert!(shows(
        &alias,
        "One rank's output of Bucketed: \
         (the allreduce of comp1's output, the allreduce of comp2's output)."
    ));
}

#[test]
fn launch_has_plain_parameters() {
    let text = page("struct.Bucketed.html");
    assert!(shows(
        &text,
        "pub fn launch(workers: Vec<Worker>, backend: impl Backend) -> Result<Self, Error>"
    ));
    assert!(shows(
        &text,
        "pub fn launch_with(workers: Vec<Worker>, backend: impl Backend, \
         options: LaunchOptions) -> Result<Self, Error>"
    ));
    assert!(shows(
        &text,
        "pub fn execute_timeout(&mut self, x: Tensor<f32>, timeout: Duration) \
         -> Result<Vec<BucketedOutput>, Error>"
    ));
}

#[test]
fn a_fixed_size_group_is_launched_as_declared() {
    let text = page("struct.Step.html");
    assert_no_plumbing("Step", &text);
    assert!(shows(
        &text,
        "pub fn launch(workers: [Worker; 4], backend: impl Backend) -> Result<Self, Error>"
    ));
    assert!(shows(
        &text,
        "returns one StepOutput per rank: (the allreduce (Avg) of comp1's output, loss's output)."
    ));
}

#[test]
fn a_fixed_size_group_comes_back_as_an_array() {
    let text = page("struct.Step.html");
    assert!(shows(
        &text,
        "pub fn teardown(self) -> Result<[Worker; 4], Error>"
    ));
}

#[test]
fn an_actor_shows_its_own_items_only() {
    let text = page("struct.Worker.html");
    assert_no_plumbing("Worker", &text);
    assert!(!text.contains("impl Actor for Worker"), "{text}");
}
