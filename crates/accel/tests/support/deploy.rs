//! What an operator deploys: the agent's container in
//! `deploy/accel-daemonset.yaml`, and the image `deploy/build-image.sh
//! --agent` packs, read as the kubelet and a container runtime read them.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use qproxy_test_support::{run_tool, untar};
use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The agent's container of the DaemonSet.
pub struct AgentContainer {
    pub image: String,
    pub args: Vec<String>,
    /// The capabilities added, upper case as the manifest spells them.
    pub capabilities: Vec<String>,
    pub dropped: Vec<String>,
    pub run_as_user: i64,
    /// The named container port `metrics`.
    pub metrics_port: i64,
    /// The readiness probe's path and port (a name or a number).
    pub probe_path: String,
    pub probe_port: Yaml,
}

impl AgentContainer {
    /// The value of `--NAME=VALUE` among the arguments.
    pub fn arg(&self, name: &str) -> Option<&str> {
        let prefix = format!("--{name}=");
        self.args.iter().find_map(|a| a.strip_prefix(&prefix))
    }
}

fn strings(yaml: &Yaml) -> Vec<String> {
    yaml.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `deploy/accel-daemonset.yaml`'s DaemonSet and its one container.
pub fn daemonset() -> AgentContainer {
    let path = repo().join("deploy/accel-daemonset.yaml");
    let text = fs::read_to_string(&path).unwrap();
    let docs = YamlLoader::load_from_str(&text).unwrap();
    let ds = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("DaemonSet"))
        .expect("the manifest holds a DaemonSet");
    assert_eq!(ds["apiVersion"].as_str(), Some("apps/v1"));
    let spec = &ds["spec"]["template"]["spec"];
    let containers = spec["containers"].as_vec().expect("containers");
    assert_eq!(containers.len(), 1, "one container, the agent");
    let c = &containers[0];
    let security = &c["securityContext"];
    let ports = c["ports"].as_vec().expect("ports");
    let metrics_port = ports
        .iter()
        .find(|p| p["name"].as_str() == Some("metrics"))
        .and_then(|p| p["containerPort"].as_i64())
        .expect("a container port named metrics");
    let probe = &c["readinessProbe"]["httpGet"];
    AgentContainer {
        image: c["image"].as_str().expect("image").to_owned(),
        args: strings(&c["args"]),
        capabilities: strings(&security["capabilities"]["add"]),
        dropped: strings(&security["capabilities"]["drop"]),
        run_as_user: security["runAsUser"].as_i64().expect("runAsUser"),
        metrics_port,
        probe_path: probe["path"].as_str().expect("probe path").to_owned(),
        probe_port: probe["port"].clone(),
    }
}

/// The agent's image archive, unpacked: its configuration and its layer.
pub struct AgentImage {
    /// The tag the archive carries (Docker's `RepoTags`).
    pub tag: String,
    /// The image's configuration (`config` of the OCI config blob).
    pub config: Value,
    /// The unpacked layer.
    pub rootfs: PathBuf,
}

impl AgentImage {
    /// The agent's binary in the layer.
    pub fn binary(&self) -> PathBuf {
        self.rootfs.join("qproxy-accel")
    }
}

/// The archive at `QPROXY_ACCEL_IMAGE` (`scripts/test` builds it first);
/// otherwise built here with `deploy/build-image.sh --agent`. Unpacked
/// once.
pub fn agent_image() -> &'static AgentImage {
    static IMAGE: OnceLock<AgentImage> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let archive = match std::env::var_os("QPROXY_ACCEL_IMAGE") {
            Some(path) => PathBuf::from(path),
            None => {
                let out =
                    run_tool(Command::new(repo().join("deploy/build-image.sh")).arg("--agent"));
                let last = String::from_utf8(out).unwrap();
                repo().join(last.lines().last().expect("the archive's path"))
            }
        };
        let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("agent-image");
        let _ = fs::remove_dir_all(&work);
        let (layout, rootfs) = (work.join("layout"), work.join("rootfs"));
        untar(&archive, &layout);
        let json = |path: &Path| -> Value {
            serde_json::from_slice(&fs::read(layout.join(path)).unwrap()).unwrap()
        };
        let docker: Value = json(Path::new("manifest.json"));
        let entry = &docker[0];
        let tags = entry["RepoTags"].as_array().expect("RepoTags");
        assert_eq!(tags.len(), 1, "one tag: {entry}");
        let layers = entry["Layers"].as_array().expect("Layers");
        assert_eq!(layers.len(), 1, "one layer: {entry}");
        untar(&layout.join(layers[0].as_str().unwrap()), &rootfs);
        let config = json(Path::new(entry["Config"].as_str().expect("Config")));
        AgentImage {
            tag: tags[0].as_str().unwrap().to_owned(),
            config: config["config"].clone(),
            rootfs,
        }
    })
}

/// Whether the ELF file at `path` asks for a dynamic loader.
pub fn dynamically_linked(path: &Path) -> bool {
    let headers = run_tool(Command::new("readelf").arg("-lW").arg(path));
    String::from_utf8_lossy(&headers).contains("INTERP")
}

/// An instruction of `deploy/accel.Dockerfile`'s final stage, each time it
/// appears: what follows its name.
pub fn dockerfile_final(instruction: &str) -> Vec<String> {
    let text = fs::read_to_string(repo().join("deploy/accel.Dockerfile")).unwrap();
    let (_, stage) = text.rsplit_once("\nFROM ").expect("a final stage");
    assert!(stage.starts_with("scratch\n"), "an empty base");
    stage
        .lines()
        .filter_map(|l| l.strip_prefix(instruction)?.strip_prefix(' '))
        .map(str::to_owned)
        .collect()
}
