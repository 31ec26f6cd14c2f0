//! What the CPU offers: the number of physical cores (the default thread count).

use std::collections::HashSet;

/// Physical cores available to this process: distinct (package, core) pairs in
/// `/proc/cpuinfo` when readable, capped by the CPUs this process may run on.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = HashSet::new();
    let mut package = None;
    for line in info.lines() {
        let mut kv = line.splitn(2, ':').map(str::trim);
        match (kv.next(), kv.next()) {
            (Some("physical id"), Some(v)) => package = Some(v.to_string()),
            (Some("core id"), Some(v)) => {
                cores.insert((package.clone(), v.to_string()));
            }
            _ => {}
        }
    }
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn at_least_one_core() {
        assert!(super::physical_cores() >= 1);
    }
}
