//! The container image `deploy/build-image.sh` writes, opened as a registry
//! tool and a container runtime would open it: its configuration, its one
//! layer, and the binary in it, run from an otherwise empty root as the
//! image's user.
//!
//! The archive under test is `QPROXY_IMAGE` when set (CI builds the release
//! image first and points this at it); otherwise the script builds one here
//! with the dev profile.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use object::read::elf::{Dyn, ElfFile64, ProgramHeader};
use qproxy_test_support::{
    App, QProxy, get, h1, knative_env, kubelet_health, run_tool, text, untar, within,
};
use serde_json::Value;

/// The image's user, as Knative's `runAsNonRoot` needs it: numeric, not 0.
const USER: &str = "65532:65532";

fn repo() -> &'static Path {
    qproxy_test_support::workspace()
}

/// The image archive, unpacked once for all the tests of this file.
struct Unpacked {
    archive: PathBuf,
    /// The archive's files: `index.json`, `manifest.json`, `blobs/sha256/…`.
    layout: PathBuf,
    /// The layer's files.
    rootfs: PathBuf,
}

fn image() -> &'static Unpacked {
    static IMAGE: OnceLock<Unpacked> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image");
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(&work).expect("scratch folder");
        let archive = match std::env::var_os("QPROXY_IMAGE") {
            Some(path) => PathBuf::from(path),
            None => {
                let archive = work.join("qproxy.tar");
                run_tool(
                    Command::new(repo().join("deploy/build-image.sh"))
                        .args(["--profile", "dev", "--tag", "qproxy:test", "--out"])
                        .arg(&archive)
                        .env("CARGO_TARGET_DIR", repo().join("target/image")),
                );
                archive
            }
        };
        let layout = work.join("layout");
        let rootfs = work.join("rootfs");
        untar(&archive, &layout);
        let unpacked = Unpacked {
            archive,
            layout,
            rootfs,
        };
        let layer = unpacked.blob(&unpacked.manifest()["layers"][0]["digest"]);
        untar(&layer, &unpacked.rootfs);
        unpacked
    })
}

impl Unpacked {
    fn json(&self, path: impl AsRef<Path>) -> Value {
        let path = self.layout.join(path);
        let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The path of a blob, after checking that its content has its digest.
    fn blob(&self, digest: &Value) -> PathBuf {
        let digest = digest.as_str().expect("digest is a string");
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        let path = self.layout.join("blobs/sha256").join(hex);
        let sum = run_tool(Command::new("sha256sum").arg(&path));
        assert!(
            sum.starts_with(hex.as_bytes()),
            "{digest} holds other bytes"
        );
        path
    }

    fn manifest(&self) -> Value {
        let index = self.json("index.json");
        let manifests = index["manifests"]
            .as_array()
            .expect("index lists manifests");
        assert_eq!(manifests.len(), 1, "one image in the archive: {index}");
        self.json(self.blob(&manifests[0]["digest"]))
    }

    fn config(&self) -> Value {
        self.json(self.blob(&self.manifest()["config"]["digest"]))
    }
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[test]
#[ignore = "needs skopeo and binutils (readelf): scripts/test installs them"]
fn config_runs_the_binary_as_an_unprivileged_user_with_the_sidecar_ports() {
    let image = image();
    let config = image.config();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], oci_arch());
    let run = &config["config"];
    assert_eq!(run["User"], USER);
    assert_eq!(run["Entrypoint"], serde_json::json!(["/qproxy"]));
    assert!(run.get("Cmd").is_none(), "no arguments: {run}");
    // Knative gives every variable but glibc's heap settings
    // (docs/configuration.md, "The image's environment").
    assert_eq!(
        run["Env"],
        serde_json::json!([
            "GLIBC_TUNABLES=glibc.malloc.trim_threshold=8388608:glibc.malloc.mmap_threshold=1048576"
        ]),
        "{run}"
    );
    let ports: BTreeSet<&str> = run["ExposedPorts"]
        .as_object()
        .expect("ports declared")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        ports,
        BTreeSet::from([
            "8008/tcp", "8012/tcp", "8013/tcp", "8022/tcp", "9090/tcp", "9091/tcp"
        ])
    );

    // One gzip layer, whose uncompressed digest is the config's diff_id.
    let manifest = image.manifest();
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1);
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = image.blob(&layers[0]["digest"]);
    let tar = run_pipe(&format!("gzip -dc '{}' | sha256sum", layer.display()));
    let diff_id = format!("sha256:{}", tar.split_whitespace().next().unwrap_or(""));
    assert_eq!(config["rootfs"]["diff_ids"], serde_json::json!([diff_id]));

    // Docker's manifest.json names the same blobs, for docker load and kind;
    // containerd (kind load, ctr import) takes the name from the index, and
    // the kubelet finds images by their fully qualified name.
    let docker = image.json("manifest.json");
    let tag = docker[0]["RepoTags"][0].as_str().expect("a tag");
    assert_eq!(
        image.json("index.json")["manifests"][0]["annotations"]["io.containerd.image.name"],
        if tag.contains('/') {
            tag.to_owned()
        } else {
            format!("docker.io/library/{tag}")
        }
    );
    let hex = |d: &Value| {
        d.as_str()
            .and_then(|d| d.strip_prefix("sha256:"))
            .map(str::to_owned)
    };
    assert_eq!(
        docker[0]["Config"].as_str().map(str::to_owned),
        hex(&manifest["config"]["digest"]).map(|h| format!("blobs/sha256/{h}"))
    );
    assert_eq!(
        docker[0]["Layers"][0].as_str().map(str::to_owned),
        hex(&layers[0]["digest"]).map(|h| format!("blobs/sha256/{h}"))
    );
}

fn run_pipe(script: &str) -> String {
    String::from_utf8_lossy(&run_tool(Command::new("sh").arg("-c").arg(script))).into_owned()
}

#[test]
#[ignore = "needs skopeo and binutils (readelf): scripts/test installs them"]
fn skopeo_reads_it_as_an_oci_and_a_docker_archive() {
    let image = image();
    for transport in ["oci-archive", "docker-archive"] {
        let reference = format!("{transport}:{}", image.archive.display());
        let config: Value = serde_json::from_slice(&run_tool(
            Command::new("skopeo")
                .args(["inspect", "--config"])
                .arg(&reference),
        ))
        .expect("skopeo prints the config");
        assert_eq!(config["config"]["User"], USER, "{transport}");
        assert_eq!(config["config"]["Entrypoint"][0], "/qproxy", "{transport}");

        // Copying checks every blob against its digest.
        let copy = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("image-copy-{transport}"));
        let _ = fs::remove_dir_all(&copy);
        run_tool(
            Command::new("skopeo")
                .args(["copy", "--quiet"])
                .arg(&reference)
                .arg(format!("dir:{}", copy.display())),
        );
    }
}

#[test]
#[ignore = "needs skopeo and binutils (readelf): scripts/test installs them"]
fn layer_holds_the_static_binary_and_the_users_only() {
    let image = image();
    let mut files = BTreeSet::new();
    let mut stack = vec![image.rootfs.clone()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("readable rootfs") {
            let path = entry.expect("entry").path();
            let name = path
                .strip_prefix(&image.rootfs)
                .expect("under rootfs")
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                stack.push(path);
            }
            files.insert(name);
        }
    }
    assert_eq!(
        files,
        BTreeSet::from(["etc", "etc/group", "etc/passwd", "qproxy"].map(String::from)),
        "no shell, no libraries"
    );
    let passwd = fs::read_to_string(image.rootfs.join("etc/passwd")).expect("passwd");
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("nonroot:x:65532:65532:")),
        "{passwd}"
    );

    use std::os::unix::fs::PermissionsExt;
    let binary = image.rootfs.join("qproxy");
    let mode = fs::metadata(&binary).expect("binary").permissions().mode();
    assert_eq!(mode & 0o777, 0o755);

    // Statically linked: no program interpreter, no shared library needed.
    let bytes = fs::read(&binary).expect("binary");
    let elf = ElfFile64::<object::Endianness>::parse(&*bytes).expect("an ELF binary");
    let endian = elf.endian();
    for header in elf.elf_program_headers() {
        assert_ne!(
            header.p_type(endian),
            object::elf::PT_INTERP,
            "asks for a dynamic loader"
        );
    }
    let dynamic = elf
        .elf_section_table()
        .dynamic(endian, &*bytes)
        .expect("readable dynamic section");
    if let Some((entries, _)) = dynamic {
        for entry in entries {
            assert!(
                entry.d_tag(endian) != object::elf::DT_NEEDED,
                "needs a shared library"
            );
        }
    }
}

/// True when this process may `chroot` and change user.
fn root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    })
}

/// The image's entrypoint, run as a runtime runs it: with the layer as the
/// whole root filesystem and as the image's user. Without root, the binary
/// is run in place instead.
fn entrypoint(image: &Unpacked) -> Command {
    if root() {
        // By its path: qproxy's environment, PATH included, is Knative's.
        let chroot = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join("chroot"))
            .find(|path| path.is_file())
            .expect("chroot on PATH");
        let mut command = Command::new(chroot);
        command
            .arg(format!("--userspec={USER}"))
            .arg(&image.rootfs)
            .arg("/qproxy");
        command
    } else {
        eprintln!("not root: running the image's binary without chroot");
        Command::new(image.rootfs.join("qproxy"))
    }
}

#[test]
#[ignore = "needs skopeo and binutils (readelf): scripts/test installs them"]
fn binary_prints_its_version_from_the_empty_root() {
    let out = run_tool(entrypoint(image()).arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("qproxy {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs skopeo and binutils (readelf): scripts/test installs them"]
async fn binary_proxies_and_drains_from_the_empty_root() {
    let app = App::hello().await;
    let mut qp = QProxy::start_command(entrypoint(image()), &knative_env(app.port()));

    let res = within("request", h1(qp.main, get("/hello", &[]))).await;
    assert_eq!(res.status(), 200);
    assert_eq!(within("body", text(res)).await, "Hello World!\n");
    assert_eq!(app.only().uri.path(), "/hello");
    assert_eq!(
        within("health check", kubelet_health(qp.main)).await,
        (200, "queue".to_owned())
    );

    qp.signal("TERM");
    let status = qp.wait_exit();
    assert!(status.success(), "exit after SIGTERM: {status}");
}

#[test]
#[ignore = "needs skopeo and binutils (readelf): scripts/test installs them"]
fn dockerfile_builds_the_image_the_archive_holds() {
    let dockerfile = fs::read_to_string(repo().join("deploy/Dockerfile")).expect("Dockerfile");
    let final_stage = dockerfile
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .expect("a final stage");
    let instruction = |name: &str| -> Vec<String> {
        final_stage
            .lines()
            .filter_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map(str::to_owned)
            .collect()
    };
    assert!(final_stage.starts_with("scratch\n"), "an empty base");
    assert_eq!(instruction("USER"), [USER]);
    assert_eq!(instruction("ENTRYPOINT"), [r#"["/qproxy"]"#]);
    assert!(instruction("CMD").is_empty());

    let config = image().config();
    let mut exposed: Vec<String> = config["config"]["ExposedPorts"]
        .as_object()
        .expect("ports")
        .keys()
        .map(|p| p.trim_end_matches("/tcp").to_owned())
        .collect();
    exposed.sort();
    let mut declared: Vec<String> = instruction("EXPOSE")
        .iter()
        .flat_map(|l| l.split_whitespace().map(str::to_owned))
        .collect();
    declared.sort();
    assert_eq!(declared, exposed);
}
