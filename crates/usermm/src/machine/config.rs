//! How a machine is built: its nodes (size, tier, CPUs) and the node of each
//! CPU, from a machine file or a preset.

use serde::{Deserialize, Serialize};

use crate::cpu::MAX_CPUS;
use crate::phys::{NodeConfig, Tier};

/// How the machine is built.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MachineConfig {
    pub nodes: Vec<NodeConfig>,
    /// The node of each CPU.
    pub cpus: Vec<usize>,
}

impl Default for MachineConfig {
    /// One 4 GiB DRAM node with four CPUs.
    fn default() -> Self {
        MachineConfig::single_node(4 << 30, 4)
    }
}

impl MachineConfig {
    /// One DRAM node of `bytes` with `nr_cpus` CPUs.
    pub fn single_node(bytes: u64, nr_cpus: usize) -> MachineConfig {
        MachineConfig {
            nodes: vec![NodeConfig {
                size_bytes: bytes,
                tier: Tier::Dram,
                has_cpus: true,
            }],
            cpus: vec![0; nr_cpus],
        }
    }

    /// The tiered machine (`--machine tiered`): node 0, 512 MiB of DRAM
    /// with four CPUs; node 1, 2 GiB of slow (CXL-like) memory without
    /// CPUs. The experiments' default region (1 GiB) overflows the fast
    /// tier.
    pub fn tiered() -> MachineConfig {
        MachineConfig::two_tiers(512 << 20, 2 << 30, 4)
    }

    /// Two tiers: node 0, `dram` bytes of DRAM with `nr_cpus` CPUs; node 1,
    /// `slow` bytes of slow memory without CPUs.
    pub fn two_tiers(dram: u64, slow: u64, nr_cpus: usize) -> MachineConfig {
        MachineConfig {
            nodes: vec![
                NodeConfig {
                    size_bytes: dram,
                    tier: Tier::Dram,
                    has_cpus: true,
                },
                NodeConfig {
                    size_bytes: slow,
                    tier: Tier::Slow,
                    has_cpus: false,
                },
            ],
            cpus: vec![0; nr_cpus],
        }
    }

    /// Whether the model can build this machine; the error says what is
    /// wrong, for people.
    pub fn validate(&self) -> Result<(), String> {
        use crate::phys::{MAX_PAGE_ORDER, NODE_PFN_SHIFT, PAGE_SIZE};
        if self.nodes.is_empty() {
            return Err("a machine needs at least one node".into());
        }
        if self.cpus.is_empty() || self.cpus.len() > MAX_CPUS {
            return Err(format!(
                "a machine has 1 to {MAX_CPUS} CPUs, not {}",
                self.cpus.len()
            ));
        }
        for (id, n) in self.nodes.iter().enumerate() {
            let min = PAGE_SIZE << MAX_PAGE_ORDER;
            let max = (PAGE_SIZE << NODE_PFN_SHIFT) - PAGE_SIZE;
            if n.size_bytes < min || n.size_bytes > max {
                return Err(format!(
                    "node {id}: {} bytes; a node holds at least {} MiB and less than {} GiB",
                    n.size_bytes,
                    min >> 20,
                    (max >> 30) + 1
                ));
            }
            if n.size_bytes % PAGE_SIZE != 0 {
                return Err(format!(
                    "node {id}: {} bytes is not a whole number of {} KiB pages",
                    n.size_bytes,
                    PAGE_SIZE >> 10
                ));
            }
        }
        for (cpu, &node) in self.cpus.iter().enumerate() {
            match self.nodes.get(node) {
                None => return Err(format!("CPU {cpu} is on node {node}, which does not exist")),
                Some(n) if !n.has_cpus => {
                    return Err(format!("CPU {cpu} is on node {node}, a node without CPUs"))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Total memory of all nodes, in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.nodes.iter().map(|n| n.size_bytes).sum()
    }
}

/// `1 node: node 0 1024 MiB dram, CPUs 0-1`, for reports.
impl std::fmt::Display for MachineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.nodes.len() == 1 { "" } else { "s" };
        write!(f, "{} node{s}", self.nodes.len())?;
        for (id, n) in self.nodes.iter().enumerate() {
            let cpus: Vec<usize> = (0..self.cpus.len())
                .filter(|&c| self.cpus[c] == id)
                .collect();
            let tier = match n.tier {
                Tier::Dram => "DRAM",
                Tier::Slow => "slow",
            };
            let size = if n.size_bytes % (1 << 30) == 0 {
                format!("{} GiB", n.size_bytes >> 30)
            } else {
                format!("{} MiB", n.size_bytes >> 20)
            };
            write!(
                f,
                "{} node {id} {size} {tier}",
                if id == 0 { ":" } else { ";" }
            )?;
            match (cpus.first(), cpus.last()) {
                (Some(a), Some(b)) if cpus.len() == b - a + 1 && a != b => {
                    write!(f, ", CPUs {a}-{b}")?
                }
                (Some(_), _) => write!(
                    f,
                    ", CPU{} {}",
                    if cpus.len() == 1 { "" } else { "s" },
                    cpus.iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                )?,
                (None, _) => write!(f, ", no CPUs")?,
            }
        }
        Ok(())
    }
}
