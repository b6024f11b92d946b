//! Sizes in bytes as an operator writes them (`2 GiB`, `512MiB`, `4096`) and as Canopy prints
//! them: one parser and one formatter for every size a config key or a message names.
//!
//! Binary units only (KiB, MiB, GiB, TiB; `K`, `M`, `G`, `T` mean the same); a decimal unit
//! (`GB`) is refused with the spelling to use, so nobody gets 7% less than they meant.
//! Does no IO.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Size(pub u64);

const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];

impl Size {
    /// Parses `4096`, `2 GiB`, `512MiB`, `1.5G`; refuses anything else, saying why.
    pub fn parse(text: &str) -> Result<Size, String> {
        let text = text.trim();
        let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
        let (number, unit) = (&text[..split], text[split..].trim());
        let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size like \"2 GiB\""))?;
        let scale: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" | "bytes" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" | "mb" | "gb" | "tb" => {
                return Err(format!("{text:?}: write binary units ({}iB)", &unit[..1].to_ascii_uppercase()));
            }
            _ => return Err(format!("{text:?} has an unknown unit {unit:?} (use KiB, MiB, GiB or TiB)")),
        };
        let bytes = value * scale as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 || (scale == 1 && value.fract() != 0.0) {
            return Err(format!("{text:?} is not a whole number of bytes"));
        }
        Ok(Size(bytes as u64))
    }
}

impl std::fmt::Display for Size {
    /// The largest binary unit at or under the size, to one decimal when not whole.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (unit, size) in UNITS {
            if self.0 >= size {
                let value = self.0 as f64 / size as f64;
                return match ((value.fract() * 10.0).round() as u64).is_multiple_of(10) {
                    true => write!(f, "{value:.0} {unit}"),
                    false => write!(f, "{value:.1} {unit}"),
                };
            }
        }
        write!(f, "{} bytes", self.0)
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Size, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Bytes(n) => Ok(Size(n)),
            Raw::Text(text) => Size::parse(&text).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn sizes_read_and_print_as_operators_write_them() {
        assert_eq!(Size::parse("2 GiB").unwrap(), Size(2 << 30));
        assert_eq!(Size::parse("512MiB").unwrap(), Size(512 << 20));
        assert_eq!(Size::parse("1.5G").unwrap(), Size(3 << 29));
        assert_eq!(Size::parse("4096").unwrap(), Size(4096));
        assert!(Size::parse("2 GB").unwrap_err().contains("GiB"));
        assert!(Size::parse("2 parsecs").unwrap_err().contains("unknown unit"));
        assert!(Size::parse("lots").is_err() && Size::parse("1.5").is_err());
        assert_eq!(Size(2 << 30).to_string(), "2 GiB");
        assert_eq!(Size(1536 << 20).to_string(), "1.5 GiB");
        assert_eq!(Size(512).to_string(), "512 bytes");
        let back: Size = serde_json::from_str(&serde_json::to_string(&Size(3 << 20)).unwrap()).unwrap();
        assert_eq!(back, Size(3 << 20));
    }
}
