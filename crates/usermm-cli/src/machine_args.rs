//! The machine a command runs on: `--machine FILE` or `--mem SIZE --cpus N`,
//! and each command's default.
//!
//! A machine file lists the NUMA nodes in order, in TOML or JSON; CPUs are
//! numbered node by node:
//!
//! ```toml
//! # A DRAM node with 4 CPUs, and 8 GiB of slow (CXL-like) memory without.
//! [[node]]
//! size = "2G"      # bytes, or a size with K, M, G or T
//! tier = "dram"    # dram (the default) or slow
//! cpus = 4
//!
//! [[node]]
//! size = "8G"
//! tier = "slow"
//! ```
//!
//! The same in JSON: `{"node": [{"size": "2G", "cpus": 4}, {"size": "8G",
//! "tier": "slow"}]}`.

use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;
use usermm::phys::{NodeConfig, Tier};
use usermm::MachineConfig;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct MachineArgs {
    /// The machine, from a TOML or JSON file (see docs/tiering.md), or the
    /// preset `tiered` (512 MiB of DRAM with 4 CPUs, 2 GiB of slow memory
    /// without).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["mem", "cpus"])]
    pub machine: Option<PathBuf>,
    /// One DRAM node of this size (K, M, G or T).
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// CPUs of that node.
    #[arg(long, value_name = "N")]
    pub cpus: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineFile {
    node: Vec<NodeFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    size: SizeField,
    #[serde(default = "dram")]
    tier: Tier,
    #[serde(default)]
    cpus: usize,
}

fn dram() -> Tier {
    Tier::Dram
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeField {
    Bytes(u64),
    Text(String),
}

/// `4096`, `512M`, `2G`, `1T`: whole bytes, or a number of KiB, MiB, GiB
/// or TiB.
pub fn parse_mem_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 10),
        Some((i, 'M')) => (&s[..i], 20),
        Some((i, 'G')) => (&s[..i], 30),
        Some((i, 'T')) => (&s[..i], 40),
        _ => (s, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(1 << shift))
        .ok_or_else(|| {
            anyhow::anyhow!("{s:?} is not a size (a number, optionally with K, M, G or T)")
        })
}

impl MachineFile {
    fn into_config(self) -> anyhow::Result<MachineConfig> {
        let mut nodes = vec![];
        let mut cpus = vec![];
        for (id, n) in self.node.into_iter().enumerate() {
            let size_bytes = match n.size {
                SizeField::Bytes(b) => b,
                SizeField::Text(t) => parse_mem_size(&t).with_context(|| format!("node {id}"))?,
            };
            cpus.extend(std::iter::repeat_n(id, n.cpus));
            nodes.push(NodeConfig {
                size_bytes,
                tier: n.tier,
                has_cpus: n.cpus > 0,
            });
        }
        Ok(MachineConfig { nodes, cpus })
    }
}

/// Read a machine file: JSON when it starts with `{`, else TOML.
fn read_machine_file(path: &std::path::Path) -> anyhow::Result<MachineConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let file: MachineFile = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?
    } else {
        toml::from_str(&text).map_err(|e| {
            // One line: where, then what (toml's own text quotes the file).
            let line = e
                .span()
                .and_then(|sp| text.get(..sp.start))
                .map_or(0, |before| before.matches('\n').count() + 1);
            anyhow::anyhow!("{}:{line}: {}", path.display(), e.message().trim())
        })?
    };
    file.into_config()
        .with_context(|| format!("{}", path.display()))
}

impl MachineArgs {
    /// Whether the user chose a machine (else the command's default).
    pub fn given(&self) -> bool {
        self.machine.is_some() || self.mem.is_some() || self.cpus.is_some()
    }

    /// The machine the options describe, with `default` for what they leave
    /// out; checked, so that building it cannot fail for a reason the user
    /// could have been told.
    pub fn config(&self, default: MachineConfig) -> anyhow::Result<MachineConfig> {
        let config = match &self.machine {
            Some(path) if path.as_os_str() == "tiered" && !path.exists() => MachineConfig::tiered(),
            Some(path) => read_machine_file(path)?,
            None => {
                let mem = match &self.mem {
                    Some(m) => parse_mem_size(m).context("--mem")?,
                    None => default.total_bytes(),
                };
                match (self.mem.is_some(), self.cpus) {
                    (false, None) => default,
                    (_, cpus) => {
                        MachineConfig::single_node(mem, cpus.unwrap_or(default.cpus.len()))
                    }
                }
            }
        };
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("machine: {e}"))?;
        check_host_fits(&config)?;
        Ok(config)
    }
}

/// The model keeps a page descriptor per frame in host memory from the start
/// (frames themselves are host memory only once touched): refuse a machine
/// whose descriptors alone would not fit.
fn check_host_fits(config: &MachineConfig) -> anyhow::Result<()> {
    let pages = config.total_bytes() >> usermm::phys::PAGE_SHIFT;
    let memmap = pages.saturating_mul(std::mem::size_of::<usermm::phys::Page>() as u64);
    let host = crate::host_memory_bytes();
    if host > 0 && memmap > host / 2 {
        anyhow::bail!(
            "machine: {} GiB needs {} MiB of page descriptors, more than half of this host's {} MiB",
            config.total_bytes() >> 30,
            memmap >> 20,
            host >> 20
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_toml(s: &str) -> anyhow::Result<MachineConfig> {
        toml::from_str::<MachineFile>(s)?.into_config()
    }

    #[test]
    fn toml_and_json_describe_the_same_machine() {
        let t = from_toml(
            "[[node]]\nsize = \"2G\"\ncpus = 4\n[[node]]\nsize = 8589934592\ntier = \"slow\"\n",
        )
        .unwrap();
        let j: MachineFile = serde_json::from_str(
            r#"{"node": [{"size": "2G", "cpus": 4}, {"size": "8G", "tier": "slow"}]}"#,
        )
        .unwrap();
        let j = j.into_config().unwrap();
        for c in [&t, &j] {
            assert_eq!(c.cpus, vec![0, 0, 0, 0]);
            assert_eq!(c.nodes[1].size_bytes, 8 << 30);
            assert_eq!(c.nodes[1].tier, Tier::Slow);
            assert!(!c.nodes[1].has_cpus);
            c.validate().unwrap();
        }
        assert_eq!(
            t.to_string(),
            "2 nodes: node 0 2 GiB DRAM, CPUs 0-3; node 1 8 GiB slow, no CPUs"
        );
    }

    #[test]
    fn bad_machines_are_errors_that_say_why() {
        let err = |s: &str| {
            from_toml(s)
                .and_then(|c| c.validate().map(|()| c).map_err(anyhow::Error::msg))
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        assert!(err("[[node]]\nsize = \"1M\"\ncpus = 1\n").contains("a node holds at least 4 MiB"));
        assert!(err("[[node]]\nsize = \"2T\"\ncpus = 1\n").contains("a node holds"));
        assert!(err("[[node]]\nsize = \"1G\"\n").contains("1 to 64 CPUs"));
        assert!(err("[[node]]\nsize = \"1G\"\ncpus = 65\n").contains("1 to 64 CPUs"));
        assert!(err("[[node]]\nsize = \"1G\"\ncpus = 1\ncolour = 3\n").contains("unknown field"));
        assert!(err("[[node]]\nsize = \"1X\"\ncpus = 1\n").contains("node 0"));
        assert!(err("[[node]]\nsize = 4194305\ncpus = 1\n").contains("whole number"));
        assert!(err("node = []\n").contains("at least one node"));
        assert!(parse_mem_size("99999999999T").is_err());
        assert_eq!(parse_mem_size("512M").unwrap(), 512 << 20);
    }

    #[test]
    fn mem_and_cpus_override_the_default() {
        let d = MachineConfig::single_node(1 << 30, 2);
        let a = MachineArgs {
            mem: Some("256M".into()),
            ..Default::default()
        };
        let c = a.config(d.clone()).unwrap();
        assert_eq!((c.total_bytes(), c.cpus.len()), (256 << 20, 2));
        let a = MachineArgs {
            cpus: Some(8),
            ..Default::default()
        };
        let c = a.config(d.clone()).unwrap();
        assert_eq!((c.total_bytes(), c.cpus.len()), (1 << 30, 8));
        let c = MachineArgs::default().config(d).unwrap();
        assert_eq!(c.to_string(), "1 node: node 0 1 GiB DRAM, CPUs 0-1");
    }
}
