//! `--tunable NAME=VALUE`: the engine's run-time switches on the command
//! line of `run`, `inspect` and `bench`.

use usermm::tunable::Tunables;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct TunableArgs {
    /// Set a tunable of the engine (repeatable), e.g. `zap_batch=off`;
    /// see docs/tunables.md for the list.
    #[arg(long = "tunable", value_name = "NAME=VALUE")]
    pub tunables: Vec<String>,
}

impl TunableArgs {
    /// Each `NAME=VALUE`, checked against the registry: a one-line error
    /// naming what is known otherwise.
    pub fn parsed(&self) -> anyhow::Result<Vec<(&str, &str)>> {
        self.tunables
            .iter()
            .map(|s| {
                let (name, value) = s
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--tunable {s:?} is not NAME=VALUE"))?;
                Tunables::parse(name, value).map_err(|e| anyhow::anyhow!("--tunable: {e}"))?;
                Ok((name, value))
            })
            .collect()
    }

    /// Set them, in order (a later one wins).
    pub fn apply(&self, t: &Tunables) -> anyhow::Result<()> {
        for (name, value) in self.parsed()? {
            t.set(name, value)?;
        }
        Ok(())
    }

    /// The host kernel runs one algorithm of each: a native run accepts
    /// only those.
    pub fn check_native(&self) -> anyhow::Result<()> {
        for (name, value) in self.parsed()? {
            let (_, info) = Tunables::info(name).expect("checked by parsed");
            if value != info.default_name() {
                anyhow::bail!(
                    "--native runs on this host's kernel, whose {name} is {}",
                    info.default_name()
                );
            }
        }
        Ok(())
    }
}
