//! The programs loaded into the kernel, their maps, and their attachment.
//!
//! In the node agent everything lives under a pin directory on bpffs
//! (`<pin-dir>/v1/`): the four maps and the sockops program's cgroup link.
//! The sk_msg program is attached to the sockhash itself and stays with it.
//! So when the agent stops, is killed or is upgraded, the sockets already
//! in the map keep their redirection, and the next agent (of the same map
//! layout, `v1`) opens the same maps. The self-test loads the same
//! programs with maps of their own, pinned nowhere, and drops them all.

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, SockHash},
    programs::{CgroupAttachMode, SkMsg, SockOps, links::FdLink, links::PinnedLink},
};

use crate::maps::{COUNTER_LEN, Counters, SockKey};

/// The compiled programs, embedded when the crate is built with the `bpf`
/// feature.
#[cfg(feature = "bpf")]
static OBJECT: Option<&[u8]> = Some(aya::include_bytes_aligned!(concat!(
    env!("OUT_DIR"),
    "/accel.bpf.o"
)));
#[cfg(not(feature = "bpf"))]
static OBJECT: Option<&[u8]> = None;

/// The layout of the pinned maps. A change to a map's key, value or size
/// is a new version, pinned beside the old one, so that an upgraded agent
/// never reads a map it does not understand.
pub const PIN_VERSION: &str = "v1";

/// The sockhash's size unless told otherwise: sockets of accelerated
/// connections on the node, two per connection.
pub const DEFAULT_MAX_SOCKETS: u32 = 65_536;

const MAPS: [&str; 4] = ["qpa_socks", "qpa_allowed", "qpa_verdicts", "qpa_counters"];
const SOCKOPS_LINK: &str = "sockops_link";

/// Why the programs could not be loaded, attached or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The binary was built without the `bpf` feature.
    #[error("this build has no BPF programs (build qproxy-accel with --features bpf)")]
    NoPrograms,
    /// Loading the object (maps and programs) failed.
    #[error("loading the BPF programs: {0}")]
    Load(#[from] aya::EbpfError),
    /// A program could not be loaded or attached.
    #[error("{what}: {source}")]
    Program {
        /// Which step.
        what: &'static str,
        /// The kernel's or aya's reason.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map could not be opened, read or written.
    #[error("{what}: {source}")]
    Map {
        /// Which map and step.
        what: &'static str,
        /// The kernel's or aya's reason.
        #[source]
        source: aya::maps::MapError,
    },
    /// Pinning or unpinning failed.
    #[error("{what} {path}: {source}")]
    Pin {
        /// Which step.
        what: &'static str,
        /// The path on bpffs.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The cgroup could not be opened.
    #[error("opening the cgroup {path}: {source}")]
    Cgroup {
        /// The cgroup's directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn program(what: &'static str) -> impl FnOnce(aya::programs::ProgramError) -> Error {
    move |source| Error::Program { what, source }
}

fn map(what: &'static str) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |source| Error::Map { what, source }
}

/// The programs and maps, loaded.
#[derive(Debug)]
pub struct Accel {
    ebpf: Ebpf,
    pins: Option<PathBuf>,
}

impl Accel {
    /// Loads the programs. With `pin_dir`, the maps are those pinned under
    /// `<pin_dir>/v1/` (created and pinned there when absent); without it,
    /// new maps of their own. `max_sockets` sizes a new sockhash; a pinned
    /// one keeps the size it was made with.
    pub fn load(pin_dir: Option<&Path>, max_sockets: u32) -> Result<Self, Error> {
        let object = OBJECT.ok_or(Error::NoPrograms)?;
        let pins = pin_dir.map(|dir| dir.join(PIN_VERSION));
        let mut loader = EbpfLoader::new();
        loader.map_max_entries("qpa_socks", max_sockets);
        if let Some(pins) = &pins {
            fs::create_dir_all(pins).map_err(|source| Error::Pin {
                what: "creating the pin directory",
                path: pins.clone(),
                source,
            })?;
            for name in MAPS {
                loader.map_pin_path(name, pins.join(name));
            }
        }
        let mut ebpf = loader.load(object)?;
        if pins.is_some()
            && let Some(aya::maps::Map::SockHash(data)) = ebpf.map("qpa_socks")
            && let Ok(info) = data.info()
            && info.max_entries() != max_sockets
        {
            tracing::warn!(
                "the pinned sockhash holds {} sockets, not the {max_sockets} asked: a pinned \
                 map keeps its size (remove the pins, with no socket in the map, to change it)",
                info.max_entries()
            );
        }
        let sockops: &mut SockOps = prog(&mut ebpf, "qpa_sockops")?;
        sockops
            .load()
            .map_err(program("loading the sockops program"))?;
        let msg: &mut SkMsg = prog(&mut ebpf, "qpa_msg")?;
        msg.load().map_err(program("loading the sk_msg program"))?;
        Ok(Self { ebpf, pins })
    }

    /// Attaches the programs: sk_msg to the sockhash, sockops to `cgroup`.
    ///
    /// With pins, both stay attached after this process exits: the sockops
    /// link is pinned (replacing one a previous agent left, which is
    /// detached once the new one is attached), and the sk_msg program stays
    /// on the pinned map.
    /// Without pins, both are detached when this value is dropped.
    pub fn attach(&mut self, cgroup: &Path) -> Result<(), Error> {
        let cgroup_dir = File::open(cgroup).map_err(|source| Error::Cgroup {
            path: cgroup.to_owned(),
            source,
        })?;
        let pins = self.pins.clone();

        let socks = self.socks()?;
        let socks_fd = socks.fd().try_clone().map_err(|source| Error::Pin {
            what: "duplicating the descriptor of",
            path: PathBuf::from("qpa_socks"),
            source,
        })?;
        let msg: &mut SkMsg = prog(&mut self.ebpf, "qpa_msg")?;
        let msg_link = msg
            .attach(&socks_fd)
            .map_err(program("attaching sk_msg to the sockhash"))?;
        if pins.is_some() {
            // The attachment belongs to the pinned map from now on.
            let link = msg
                .take_link(msg_link)
                .map_err(program("keeping the sk_msg attachment"))?;
            std::mem::forget(link);
        }

        // A bpf_link (Linux 5.7) takes no flags: links to one cgroup always
        // run side by side, so other programs there are left alone.
        let sockops: &mut SockOps = prog(&mut self.ebpf, "qpa_sockops")?;
        let link = sockops
            .attach(&cgroup_dir, CgroupAttachMode::Single)
            .map_err(program("attaching sockops to the cgroup"))?;
        if let Some(pins) = &pins {
            // The new link is attached before the one a previous agent left
            // is detached, so that no connection is made with neither (it
            // would stay on TCP for its life); in between, both insert and
            // the second finds the socket there already.
            let path = pins.join(SOCKOPS_LINK);
            let link = sockops
                .take_link(link)
                .map_err(program("taking the sockops link"))?;
            let link: FdLink = link
                .try_into()
                .map_err(|e: aya::programs::links::LinkError| Error::Pin {
                    what: "the sockops link",
                    path: path.clone(),
                    source: io::Error::other(e),
                })?;
            // bpffs takes no dot in a name.
            let fresh = pins.join(format!("{SOCKOPS_LINK}_new"));
            if fresh.exists() {
                detach_pinned(&fresh)?;
            }
            link.pin(&fresh).map_err(|e| Error::Pin {
                what: "pinning the sockops link at",
                path: fresh.clone(),
                source: io::Error::other(e),
            })?;
            if path.exists() {
                detach_pinned(&path)?;
            }
            fs::rename(&fresh, &path).map_err(|source| Error::Pin {
                what: "renaming the sockops link to",
                path,
                source,
            })?;
        }
        Ok(())
    }

    /// Lets the loopback connections of network namespace `netns` that
    /// have `user_port` at one end be accelerated from now on.
    pub fn allow(&mut self, netns: u64, user_port: u16) -> Result<(), Error> {
        self.allowed_map()?
            .insert(netns, u32::from(user_port), 0)
            .map_err(map("allowing a network namespace"))
    }

    /// Stops accelerating new connections in `netns`; those already in
    /// the map keep going.
    pub fn disallow(&mut self, netns: u64) -> Result<(), Error> {
        match self.allowed_map()?.remove(&netns) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(Error::Map {
                what: "disallowing a network namespace",
                source,
            }),
        }
    }

    /// The cookies of the network namespaces allowed.
    pub fn allowed(&mut self) -> Result<Vec<u64>, Error> {
        self.allowed_map()?
            .keys()
            .map(|netns| netns.map_err(map("reading the allowed namespaces")))
            .collect()
    }

    /// The programs' counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters, Error> {
        let counters: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.map_named("qpa_counters")?)
                .map_err(map("opening the counters"))?;
        let mut slots = [0u64; COUNTER_LEN as usize];
        for (i, slot) in (0..COUNTER_LEN).zip(slots.iter_mut()) {
            let per_cpu = counters.get(&i, 0).map_err(map("reading a counter"))?;
            *slot = per_cpu.iter().sum();
        }
        Ok(Counters::from_slots(slots))
    }

    /// How many sockets are in the map now.
    pub fn sockets(&self) -> Result<usize, Error> {
        let mut n = 0;
        for key in self.socks()?.keys() {
            key.map_err(map("reading the sockhash"))?;
            n += 1;
        }
        Ok(n)
    }

    fn map_named(&self, name: &'static str) -> Result<&aya::maps::Map, Error> {
        self.ebpf.map(name).ok_or_else(|| missing_map(name))
    }

    fn socks(&self) -> Result<SockHash<&MapData, SockKey>, Error> {
        SockHash::try_from(self.map_named("qpa_socks")?).map_err(map("opening the sockhash"))
    }

    fn allowed_map(&mut self) -> Result<HashMap<&mut MapData, u64, u32>, Error> {
        let allowed = self
            .ebpf
            .map_mut("qpa_allowed")
            .ok_or_else(|| missing_map("qpa_allowed"))?;
        HashMap::try_from(allowed).map_err(map("opening the allowed namespaces"))
    }
}

/// Detaches the sockops program a previous agent pinned under `pin_dir`:
/// no new connection is accelerated. The maps and the sk_msg program stay,
/// so the connections already redirected go on.
pub fn detach(pin_dir: &Path) -> Result<bool, Error> {
    let path = pin_dir.join(PIN_VERSION).join(SOCKOPS_LINK);
    if !path.exists() {
        return Ok(false);
    }
    detach_pinned(&path)?;
    Ok(true)
}

fn detach_pinned(path: &Path) -> Result<(), Error> {
    let link = PinnedLink::from_pin(path).map_err(|e| Error::Pin {
        what: "opening the pinned sockops link",
        path: path.to_owned(),
        source: io::Error::other(e),
    })?;
    let link = link.unpin().map_err(|source| Error::Pin {
        what: "unpinning the sockops link",
        path: path.to_owned(),
        source,
    })?;
    // The last reference to the link: dropping it detaches the program.
    drop(link);
    Ok(())
}

fn missing_map(name: &'static str) -> Error {
    Error::Map {
        what: name,
        source: aya::maps::MapError::InvalidName {
            name: name.to_owned(),
        },
    }
}

fn prog<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, Error>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf.program_mut(name).ok_or(Error::Program {
        what: name,
        source: aya::programs::ProgramError::UnexpectedProgramType,
    })?;
    p.try_into().map_err(program(name))
}
