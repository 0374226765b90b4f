//! The two image recipes stay one image: the final stage of the root
//! `Dockerfile` (what users build with Docker) and `image/Containerfile`
//! (what `image/build.sh` and the image test build offline with podman) have
//! the same instructions, only the source of each COPY differs. Both put
//! `hostmesh` on the PATH the init container's bare `hostmesh install-agent`
//! needs, run as a non-root user, and keep `target/` out of the context.

use std::path::PathBuf;

fn read(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Instructions (continuations joined, comments dropped) after the last
/// `FROM scratch`, with each COPY reduced to its destination.
fn final_stage(text: &str) -> Vec<String> {
    let mut joined = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part.trim_end());
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                joined.push(std::mem::take(&mut cur));
            }
        }
    }
    let start = joined
        .iter()
        .rposition(|l| l == "FROM scratch")
        .expect("a FROM scratch stage");
    joined[start..]
        .iter()
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            if words[0] == "COPY" {
                format!("COPY {}", words.last().unwrap())
            } else {
                words.join(" ")
            }
        })
        .collect()
}

#[test]
fn dockerfile_final_stage_and_containerfile_build_the_same_image() {
    let docker = final_stage(&read("Dockerfile"));
    let podman = final_stage(&read("image/Containerfile"));
    assert_eq!(docker, podman);
}

#[test]
fn the_entrypoint_is_on_path_and_the_user_is_not_root() {
    let stage = final_stage(&read("Dockerfile"));
    let entry = stage
        .iter()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .expect("ENTRYPOINT");
    let entry: Vec<String> = serde_json::from_str(entry).expect("exec-form ENTRYPOINT");
    let bin = PathBuf::from(&entry[0]);
    assert_eq!(bin.file_name().unwrap(), "hostmesh");
    let path = stage
        .iter()
        .find_map(|l| l.strip_prefix("ENV PATH="))
        .expect("ENV PATH");
    assert!(
        path.split(':')
            .any(|d| std::path::Path::new(d) == bin.parent().unwrap()),
        "{path} lacks the directory of {bin:?}: the init container runs `hostmesh` by name"
    );
    assert!(
        stage.contains(&format!("COPY {}", bin.display())),
        "{stage:?}"
    );
    assert!(stage.contains(&"USER 65532:65532".to_string()), "{stage:?}");
    let version = format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"));
    assert!(stage.contains(&version), "{stage:?} lacks {version}");
}

#[test]
fn the_docker_context_leaves_out_build_output() {
    let ignore = read(".dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "target/"), "{ignore}");
}
