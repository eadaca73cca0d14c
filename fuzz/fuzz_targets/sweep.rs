//! A sweep's plan (`tinylm sweep --config base.toml --grid KEY=V1,V2 --list A,B`):
//! the base configuration file, one `--grid` value per line of the second part
//! and one `--list` value per line of the third, read by `read_config_file`,
//! `Axis::parse`, `Variant::parse_list` and `sweep::points`. A refusal is an
//! error; planning allocates at most 4 KiB per input byte beyond 4 MiB (each point
//! is a whole configuration); every point is a valid configuration in its own
//! directory.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;
use std::path::Path;
use tinylm::sweep::{points, Axis, Variant};
use tinylm::train::read_config_file;
use tinylm_fuzz::{parts, refused, within, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 4 << 10,
    fixed: 4 << 20,
};

fuzz_target!(|data: &[u8]| {
    let [base, grid, list] = parts::<3>(data);
    let path = write("base.toml", base);
    let base = match read_config_file(&path) {
        Ok(base) if base["resume"].is_null() => base,
        Ok(_) => return,
        Err(e) => return refused(&e, &path),
    };
    let planned = within("the sweep's plan", data.len(), BOUND, || {
        let axes = (String::from_utf8_lossy(grid).lines())
            .map(Axis::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let mut variants = Vec::new();
        for spec in String::from_utf8_lossy(list).lines() {
            variants.extend(Variant::parse_list(spec)?);
        }
        points(&base, &axes, &variants, Path::new("sweep"))
    });
    let planned = match planned {
        Ok(points) => points,
        Err(e) => return assert!(!e.to_string().is_empty()),
    };
    let mut dirs = HashSet::new();
    for point in &planned {
        point
            .config
            .validate()
            .expect("every point is a valid configuration");
        assert!(
            dirs.insert(&point.config.out_dir),
            "two points share {:?}",
            point.config.out_dir
        );
        assert_eq!(point.config.out_dir, Path::new("sweep").join(&point.name));
    }
});
