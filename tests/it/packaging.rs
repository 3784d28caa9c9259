//! The packages are ready for crates.io: names of their own, the metadata crates.io and
//! docs.rs read, and the licence files the licence names. `cargo publish --workspace
//! --dry-run` in `.ci/run` checks that they package and build; this checks what a dry run
//! accepts silently.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// `cargo metadata` of the workspace's own packages.
fn packages() -> Vec<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    meta["packages"].as_array().expect("a package list").clone()
}

/// Whether crates.io would take the package (`publish = false` gives an empty list).
fn published(p: &Value) -> bool {
    p["publish"]
        .as_array()
        .is_none_or(|registries| !registries.is_empty())
}

fn text<'a>(p: &'a Value, key: &str) -> &'a str {
    p[key].as_str().unwrap_or("")
}

#[test]
fn the_published_packages_carry_the_projects_name_and_metadata() {
    let published: Vec<Value> = packages().into_iter().filter(published).collect();
    let mut names: Vec<&str> = published.iter().map(|p| text(p, "name")).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["actorgraph", "actorgraph-macros", "actorgraph-runtime"]
    );
    for p in &published {
        let name = text(p, "name");
        for key in ["description", "license", "readme", "documentation"] {
            assert!(!text(p, key).is_empty(), "{name} has no `{key}`");
        }
        for key in ["keywords", "categories"] {
            let list = p[key].as_array().map_or(0, Vec::len);
            assert!((1..=5).contains(&list), "{name} has {list} {key}");
        }
        let repository = text(p, "repository");
        assert!(
            !repository.contains(".invalid"),
            "{name}'s repository is a placeholder: {repository}"
        );
        let dir = Path::new(text(p, "manifest_path")).parent().unwrap();
        assert!(
            dir.join(text(p, "readme")).is_file(),
            "{name}'s readme is missing"
        );
        for licence in ["LICENSE-MIT", "LICENSE-APACHE"] {
            assert!(dir.join(licence).is_file(), "{name} ships no {licence}");
        }
    }
}

#[test]
fn docs_rs_builds_the_reference_with_its_features() {
    for p in packages().iter().filter(|p| published(p)) {
        let name = text(p, "name");
        if name == "actorgraph-macros" {
            continue;
        }
        let features = &p["metadata"]["docs"]["rs"]["features"];
        let features: Vec<&str> = features
            .as_array()
            .unwrap_or_else(|| panic!("{name} has no [package.metadata.docs.rs] features"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for needed in ["nccl", "ndarray", "candle", "tracing"] {
            assert!(
                features.contains(&needed),
                "docs.rs would build {name} without `{needed}`"
            );
        }
    }
}

/// The version requirement of dependency `dep` of package `package`, without its `^`.
fn requirement(packages: &[Value], package: &str, dep: &str) -> String {
    let p = packages
        .iter()
        .find(|p| text(p, "name") == package)
        .unwrap_or_else(|| panic!("no package {package}"));
    let d = p["dependencies"]
        .as_array()
        .and_then(|deps| deps.iter().find(|d| text(d, "name") == dep))
        .unwrap_or_else(|| panic!("{package} does not depend on {dep}"));
    text(d, "req").trim_start_matches('^').to_string()
}

#[test]
fn the_candle_page_names_the_candle_version_actorgraph_is_built_with() {
    let packages = packages();
    let core = requirement(&packages, "actorgraph-runtime", "candle-core");
    // The main job's candle-nn must match, or its tensors would be another crate's.
    assert_eq!(requirement(&packages, "actorgraph", "candle-nn"), core);
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/reference/candle.md"
    ))
    .expect("the candle page");
    assert!(page.contains(&format!("candle-core {core}")), "{core}");
    assert!(page.contains(&format!("candle-nn = \"{core}\"")), "{core}");
}
