//! Numbers and tables as text for people, for every front end: thousands
//! separators, counts, byte sizes and FLOPs in units (and byte sizes read back), and
//! aligned tables.

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// `x` scaled to the largest unit it reaches (`units[k]` = `base^k`), 3 significant digits.
fn scaled(x: f64, base: f64, units: &[&str]) -> String {
    let mut k = 0;
    let mut v = x;
    while v >= base && k + 1 < units.len() {
        v /= base;
        k += 1;
    }
    let digits = match v {
        _ if k == 0 || v >= 100.0 => 0,
        _ if v >= 10.0 => 1,
        _ => 2,
    };
    format!("{v:.digits$} {}", units[k]).trim_end().to_string()
}

/// A count in thousands (`K`), millions (`M`), billions (`B`), ...: `2.13 B`.
pub fn count(n: u64) -> String {
    scaled(n as f64, 1000.0, &["", "K", "M", "B", "T"])
}

/// Bytes in binary units: `3.00 GiB`, `256 MiB`, `1000 B`.
pub fn byte_size(n: u64) -> String {
    scaled(n as f64, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB", "PiB"])
}

/// FLOPs in decimal units: `4.51 TFLOP`.
pub fn flop_count(n: u64) -> String {
    scaled(
        n as f64,
        1000.0,
        &["FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"],
    )
}

/// A byte size as people write it: `24GiB`, `24G`, `512MiB`, `512M`, `64KiB`, or
/// plain bytes (binary units); the error quotes the text.
pub fn parse_byte_size(text: &str) -> Result<u64, String> {
    let units = [
        ("GiB", 1u64 << 30),
        ("G", 1 << 30),
        ("MiB", 1 << 20),
        ("M", 1 << 20),
        ("KiB", 1 << 10),
        ("K", 1 << 10),
        ("B", 1),
        ("", 1),
    ];
    let (number, unit) = units
        .iter()
        .find_map(|&(suffix, unit)| Some((text.trim().strip_suffix(suffix)?, unit)))
        .expect("the empty suffix matches");
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 24GiB, 512MiB or 1000000"))?;
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!("{text:?} is not a positive size"));
    }
    Ok((value * unit as f64) as u64)
}

/// `rows` as lines of text: every column padded to its widest cell, cells two
/// spaces apart after `indent` spaces, the columns from `right_from` on
/// right-aligned (numbers) and the ones before left-aligned, trailing spaces cut.
pub fn table(rows: &[Vec<String>], indent: usize, right_from: usize) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            let cells = rows.iter().filter_map(|r| r.get(i));
            cells.map(|s| s.chars().count()).max().unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = " ".repeat(indent);
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line += "  ";
            }
            let pad = " ".repeat(widths[i] - cell.chars().count());
            match i >= right_from {
                true => line += &format!("{pad}{cell}"),
                false => line += &format!("{cell}{pad}"),
            }
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

/// A table row from string slices.
pub fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_grouping() {
        assert_eq!(thousands(2_127_057_600), "2,127,057,600");
        assert_eq!(thousands(999), "999");
        assert_eq!(count(2_127_057_600), "2.13 B");
        assert_eq!(count(512), "512");
        assert_eq!(flop_count(4_513_336_524_800), "4.51 TFLOP");
        assert_eq!(byte_size(3 << 30), "3.00 GiB");
        assert_eq!(byte_size(1000), "1000 B");
        assert_eq!(byte_size(256 << 20), "256 MiB");
        assert_eq!(parse_byte_size("24GiB"), Ok(24 << 30));
        assert_eq!(parse_byte_size("1.5 M"), Ok(3 << 19));
        assert_eq!(parse_byte_size("1000"), Ok(1000));
        assert!(parse_byte_size("lots").unwrap_err().contains("\"lots\""));
        assert!(parse_byte_size("-1G").unwrap_err().contains("positive"));
    }

    #[test]
    fn tables_pad_align_and_indent() {
        let rows = [row(["name", "bytes"]), row(["ab", "1"]), row(["c", "100"])];
        assert_eq!(
            table(&rows, 2, 1),
            "  name  bytes\n  ab        1\n  c       100\n"
        );
        assert_eq!(
            table(&rows, 0, usize::MAX),
            "name  bytes\nab    1\nc     100\n"
        );
    }
}
