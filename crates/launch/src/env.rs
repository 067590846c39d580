//! The launcher's environment: who this process is in a multi-process job.

use crate::LaunchError;

/// The variables a torchrun-style launcher sets, in the order error messages list them.
const VARS: [&str; 5] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// torchrun's default, used only when a one-process world gives no port (nothing listens).
const DEFAULT_MASTER_PORT: u16 = 29500;

/// The port of dflash's own rendezvous, for launchers that keep `MASTER_PORT` for themselves.
const DFLASH_MASTER_PORT: &str = "DFLASH_MASTER_PORT";

/// torchrun sets these in every worker (and no plain launcher does): its agent's TCPStore
/// already listens on `MASTER_PORT` on node 0, so rank 0 could not bind it, and a rank that
/// connected there would be talking to torchrun's store.
const TORCHRUN_MARKERS: [&str; 2] = ["TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"];

/// Where the rendezvous port ([`LaunchEnv::master_port`]) came from, so that a failure to
/// listen or connect names the variable to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortOrigin {
    /// `MASTER_PORT`, as the launcher set it.
    MasterPort,
    /// `DFLASH_MASTER_PORT`, which wins over everything else.
    DflashMasterPort,
    /// `MASTER_PORT + 1`: torchrun's own store holds `MASTER_PORT` (a `TORCHELASTIC_*`
    /// variable is set), and every rank derives the same port from the same `MASTER_PORT`.
    AfterTorchrunStore,
}

impl PortOrigin {
    /// The variable a person changes to move the port.
    pub(crate) fn var(self) -> &'static str {
        match self {
            PortOrigin::MasterPort | PortOrigin::AfterTorchrunStore => "MASTER_PORT",
            PortOrigin::DflashMasterPort => DFLASH_MASTER_PORT,
        }
    }

    /// What the port is and how to move it, as error messages say it.
    pub(crate) fn advice(self) -> &'static str {
        match self {
            PortOrigin::MasterPort => {
                "the port is MASTER_PORT; where the launcher itself listens on MASTER_PORT, set \
                 DFLASH_MASTER_PORT to another free port, the same on every rank"
            }
            PortOrigin::DflashMasterPort => {
                "the port is DFLASH_MASTER_PORT, which must be free on rank 0's host and the same \
                 on every rank"
            }
            PortOrigin::AfterTorchrunStore => {
                "the port is MASTER_PORT+1, since under torchrun its own store holds MASTER_PORT; \
                 set DFLASH_MASTER_PORT to another free port, the same on every rank"
            }
        }
    }
}

/// This process's place in a multi-process job, as the launcher described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank, `0..world_size`; rank 0 creates the payload and serves the rendezvous.
    pub rank: usize,
    pub world_size: usize,
    /// Rank on this host: which local GPU this process drives.
    pub local_rank: usize,
    /// Where rank 0 listens: a host name or an IP address of rank 0's host.
    pub master_addr: String,
    /// The port of dflash's rendezvous: `MASTER_PORT`, unless `port_origin` says otherwise.
    pub master_port: u16,
    pub port_origin: PortOrigin,
}

impl LaunchEnv {
    /// Reads the process environment; see [`from_vars`](Self::from_vars).
    pub fn from_env() -> Result<Option<LaunchEnv>, LaunchError> {
        // Lossy, so a non-UTF-8 value fails to parse with its variable named rather than
        // counting as unset.
        Self::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the five variables through `lookup` (so tests need not touch the process
    /// environment). `Ok(None)` when none is set: a plain single-process run. Otherwise
    /// `WORLD_SIZE` and `RANK` are required, `MASTER_ADDR` and `MASTER_PORT` too when
    /// `WORLD_SIZE > 1`, and `LOCAL_RANK` defaults to `RANK`. A half-set environment is an
    /// error rather than a silent single-process run, since it means a launch went wrong: one
    /// process training alone would waste the whole allocation. An empty value counts as unset.
    ///
    /// The rendezvous port is `DFLASH_MASTER_PORT` where set; else, under torchrun (whose
    /// store already listens on `MASTER_PORT`; `TORCHELASTIC_RUN_ID` or
    /// `TORCHELASTIC_USE_AGENT_STORE` set), `MASTER_PORT + 1`; else `MASTER_PORT`
    /// ([`PortOrigin`]). `DFLASH_MASTER_PORT` alone does not make a multi-process run.
    pub fn from_vars(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<LaunchEnv>, LaunchError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let [rank, world, local, addr, port] = VARS.map(get);
        let set: Vec<&str> = VARS
            .iter()
            .zip([&rank, &world, &local, &addr, &port])
            .filter(|(_, v)| v.is_some())
            .map(|(name, _)| *name)
            .collect();
        if set.is_empty() {
            return Ok(None);
        }
        let together = |var| LaunchError::MissingVar {
            var,
            reason: format!(
                "{} {} set, and a multi-process launch sets RANK and WORLD_SIZE together",
                set.join(", "),
                if set.len() == 1 { "is" } else { "are" }
            ),
        };
        let Some(world) = world else {
            return Err(together("WORLD_SIZE"));
        };
        let Some(rank) = rank else {
            return Err(together("RANK"));
        };
        let world_size = parse_count("WORLD_SIZE", &world)?;
        let rank = parse_count("RANK", &rank)?;
        let local_rank = match local {
            Some(v) => parse_count("LOCAL_RANK", &v)?,
            None => rank,
        };
        let (master_addr, master_port) = if world_size > 1 {
            let needs = |var| LaunchError::MissingVar {
                var,
                reason: format!(
                    "WORLD_SIZE={world_size} needs MASTER_ADDR and MASTER_PORT, where rank 0 \
                     listens for the other ranks"
                ),
            };
            let addr = addr.ok_or_else(|| needs("MASTER_ADDR"))?;
            let port = port.ok_or_else(|| needs("MASTER_PORT"))?;
            (addr, parse_port("MASTER_PORT", &port)?)
        } else {
            let port = port
                .as_deref()
                .map(|p| parse_port("MASTER_PORT", p))
                .transpose()?;
            (
                addr.unwrap_or_else(|| "127.0.0.1".to_owned()),
                port.unwrap_or(DEFAULT_MASTER_PORT),
            )
        };
        let torchrun = TORCHRUN_MARKERS.iter().any(|v| get(v).is_some());
        let (master_port, port_origin) =
            rendezvous_port(master_port, get(DFLASH_MASTER_PORT), torchrun)?;
        let env = LaunchEnv {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
            port_origin,
        };
        env.validate()?;
        Ok(Some(env))
    }

    /// `MASTER_ADDR:MASTER_PORT` as error messages and logs print it (`[v6]:port` for IPv6).
    pub fn master_endpoint(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }

    /// The checks that hold whoever built the value (the fields are public), so
    /// [`rendezvous`](crate::rendezvous) rejects a nonsensical world before it opens a socket.
    pub(crate) fn validate(&self) -> Result<(), LaunchError> {
        if self.world_size == 0 {
            return Err(LaunchError::InvalidVar {
                var: "WORLD_SIZE",
                value: "0".to_owned(),
                reason: "a world has at least one process",
            });
        }
        for (var, rank) in [("RANK", self.rank), ("LOCAL_RANK", self.local_rank)] {
            if rank >= self.world_size {
                return Err(LaunchError::RankOutOfRange {
                    var,
                    rank,
                    world_size: self.world_size,
                });
            }
        }
        if self.master_port == 0 {
            return Err(LaunchError::InvalidVar {
                var: self.port_origin.var(),
                value: "0".to_owned(),
                reason: "port 0 picks a random port, which the other ranks cannot know",
            });
        }
        if self.world_size > 1 && self.master_addr.trim().is_empty() {
            return Err(LaunchError::MissingVar {
                var: "MASTER_ADDR",
                reason: format!("WORLD_SIZE={} needs rank 0's address", self.world_size),
            });
        }
        Ok(())
    }

    /// The host part as the resolver takes it: brackets of an IPv6 literal stripped.
    pub(crate) fn master_host(&self) -> &str {
        let a = self.master_addr.trim();
        a.strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(a)
    }
}

fn parse_count(var: &'static str, value: &str) -> Result<usize, LaunchError> {
    value.parse().map_err(|_| LaunchError::InvalidVar {
        var,
        value: value.to_owned(),
        reason: "not a non-negative integer",
    })
}

fn parse_port(var: &'static str, value: &str) -> Result<u16, LaunchError> {
    value.parse().map_err(|_| LaunchError::InvalidVar {
        var,
        value: value.to_owned(),
        reason: "not a TCP port (1..=65535)",
    })
}

/// The port of dflash's rendezvous and where it came from ([`LaunchEnv::from_vars`]).
fn rendezvous_port(
    master_port: u16,
    dflash_port: Option<String>,
    torchrun: bool,
) -> Result<(u16, PortOrigin), LaunchError> {
    if let Some(p) = dflash_port {
        return Ok((
            parse_port(DFLASH_MASTER_PORT, &p)?,
            PortOrigin::DflashMasterPort,
        ));
    }
    if !torchrun {
        return Ok((master_port, PortOrigin::MasterPort));
    }
    match master_port.checked_add(1) {
        Some(p) => Ok((p, PortOrigin::AfterTorchrunStore)),
        None => Err(LaunchError::InvalidVar {
            var: "MASTER_PORT",
            value: master_port.to_string(),
            reason: "under torchrun, whose store holds MASTER_PORT, dflash listens on \
                     MASTER_PORT+1, past the last port: set DFLASH_MASTER_PORT to a free port, \
                     the same on every rank",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> Result<Option<LaunchEnv>, LaunchError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_vars(|name| map.get(name).cloned())
    }

    const FULL: [(&str, &str); 5] = [
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "node-0.cluster"),
        ("MASTER_PORT", "29501"),
    ];

    /// FULL with `name` replaced by `value` (or removed when `None`).
    fn with(name: &str, value: Option<&str>) -> Vec<(&'static str, String)> {
        FULL.iter()
            .filter_map(|&(k, v)| match (k == name, value) {
                (false, _) => Some((k, v.to_owned())),
                (true, Some(new)) => Some((k, new.to_owned())),
                (true, None) => None,
            })
            .collect()
    }

    fn err_of(pairs: &[(&'static str, String)]) -> String {
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match vars(&pairs) {
            Err(e) => e.to_string(),
            Ok(env) => panic!("expected an error for {pairs:?}, got {env:?}"),
        }
    }

    #[test]
    fn unset_is_a_single_process_run() {
        assert_eq!(vars(&[]).unwrap(), None);
        // Empty values count as unset.
        assert_eq!(vars(&[("RANK", ""), ("MASTER_ADDR", "  ")]).unwrap(), None);
    }

    #[test]
    fn full_set_reads_every_value() {
        let env = vars(&FULL).unwrap().unwrap();
        assert_eq!(
            env,
            LaunchEnv {
                rank: 3,
                world_size: 8,
                local_rank: 1,
                master_addr: "node-0.cluster".to_owned(),
                master_port: 29501,
                port_origin: PortOrigin::MasterPort,
            }
        );
        assert_eq!(env.master_endpoint(), "node-0.cluster:29501");
    }

    #[test]
    fn local_rank_defaults_to_rank() {
        let pairs = with("LOCAL_RANK", None);
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(vars(&pairs).unwrap().unwrap().local_rank, 3);
    }

    #[test]
    fn one_process_world_needs_no_master() {
        let env = vars(&[("RANK", "0"), ("WORLD_SIZE", "1")])
            .unwrap()
            .unwrap();
        assert_eq!((env.rank, env.world_size, env.local_rank), (0, 1, 0));
        assert_eq!(env.master_port, DEFAULT_MASTER_PORT);
    }

    #[test]
    fn ipv6_endpoint_is_bracketed() {
        let env = LaunchEnv {
            rank: 0,
            world_size: 2,
            local_rank: 0,
            master_addr: "::1".to_owned(),
            master_port: 7,
            port_origin: PortOrigin::MasterPort,
        };
        assert_eq!(env.master_endpoint(), "[::1]:7");
        assert_eq!(env.master_host(), "::1");
        let bracketed = LaunchEnv {
            master_addr: "[::1]".to_owned(),
            ..env
        };
        assert_eq!(bracketed.master_endpoint(), "[::1]:7");
        assert_eq!(bracketed.master_host(), "::1");
    }

    #[test]
    fn missing_required_variables_are_named() {
        for var in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
            let e = err_of(&with(var, None));
            assert!(e.starts_with(&format!("{var} is not set")), "{var}: {e}");
        }
        // One stray variable is a broken launch, not a single-process run.
        let e = err_of(&[("MASTER_ADDR", "10.0.0.1".to_owned())]);
        assert!(
            e.contains("WORLD_SIZE is not set") && e.contains("MASTER_ADDR is set"),
            "{e}"
        );
        let e = err_of(&[("LOCAL_RANK", "0".to_owned())]);
        assert!(e.contains("WORLD_SIZE"), "{e}");
    }

    #[test]
    fn unparsable_values_name_variable_and_value() {
        for (var, bad) in [
            ("RANK", "one"),
            ("RANK", "-1"),
            ("WORLD_SIZE", "8.0"),
            ("LOCAL_RANK", "x"),
            ("MASTER_PORT", "70000"),
            ("MASTER_PORT", "http"),
        ] {
            let e = err_of(&with(var, Some(bad)));
            assert!(e.contains(&format!("{var}=\"{bad}\"")), "{var}={bad}: {e}");
        }
    }

    #[test]
    fn out_of_range_values_are_named() {
        let e = err_of(&with("RANK", Some("8")));
        assert!(e.contains("RANK=8") && e.contains("WORLD_SIZE=8"), "{e}");
        let e = err_of(&with("LOCAL_RANK", Some("9")));
        assert!(e.contains("LOCAL_RANK=9"), "{e}");
        let e = err_of(&with("WORLD_SIZE", Some("0")));
        assert!(e.contains("WORLD_SIZE=\"0\""), "{e}");
        let e = err_of(&with("MASTER_PORT", Some("0")));
        assert!(e.contains("MASTER_PORT=\"0\""), "{e}");
    }

    /// FULL plus `extra`, parsed.
    fn full_and(extra: &[(&str, &str)]) -> Result<Option<LaunchEnv>, LaunchError> {
        let pairs: Vec<(&str, &str)> = FULL.iter().chain(extra).copied().collect();
        vars(&pairs)
    }

    #[test]
    fn under_torchrun_the_rendezvous_moves_off_its_store() {
        // torchrun's agent store listens on MASTER_PORT; every rank derives the same next port.
        for marker in TORCHRUN_MARKERS {
            let env = full_and(&[(marker, "True")]).unwrap().unwrap();
            assert_eq!(env.master_port, 29502, "{marker}");
            assert_eq!(env.port_origin, PortOrigin::AfterTorchrunStore);
            assert_eq!(env.master_endpoint(), "node-0.cluster:29502");
        }
        // No marker: MASTER_PORT as given.
        let env = vars(&FULL).unwrap().unwrap();
        assert_eq!(
            (env.master_port, env.port_origin),
            (29501, PortOrigin::MasterPort)
        );
        // The last port has no next one: the error says what to set.
        let pairs = with("MASTER_PORT", Some("65535"));
        let mut pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        pairs.push(("TORCHELASTIC_RUN_ID", "none"));
        let e = vars(&pairs).unwrap_err().to_string();
        assert!(
            e.contains("MASTER_PORT=\"65535\"") && e.contains("set DFLASH_MASTER_PORT"),
            "{e}"
        );
    }

    #[test]
    fn dflash_master_port_wins() {
        for extra in [
            &[(DFLASH_MASTER_PORT, "31000")][..],
            &[
                (DFLASH_MASTER_PORT, " 31000 "),
                ("TORCHELASTIC_RUN_ID", "job7"),
            ][..],
        ] {
            let env = full_and(extra).unwrap().unwrap();
            assert_eq!(
                (env.master_port, env.port_origin),
                (31000, PortOrigin::DflashMasterPort),
                "{extra:?}"
            );
        }
        for bad in ["0", "http", "70000"] {
            let e = full_and(&[(DFLASH_MASTER_PORT, bad)])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("DFLASH_MASTER_PORT=\"{bad}\"")),
                "{bad}: {e}"
            );
        }
        // Alone it is a setting, not a launch: a plain run stays a plain run.
        assert_eq!(vars(&[(DFLASH_MASTER_PORT, "31000")]).unwrap(), None);
    }
}
