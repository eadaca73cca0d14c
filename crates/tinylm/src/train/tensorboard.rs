//! TensorBoard event files: the run's scalars and its configuration, as TensorBoard
//! (and W&B, which imports TensorBoard logs) read them.
//!
//! An event file is a sequence of TFRecords, each
//!
//! ```text
//! u64 length (little-endian) | u32 masked CRC-32C of the length | data | u32 masked CRC-32C of the data
//! ```
//!
//! where the mask is `((crc >> 15) | (crc << 17)) + 0xa282ead8` (TensorFlow's
//! `tsl/lib/hash/crc32c.h`), and each record's data is an `Event` protobuf
//! (`tensorflow/core/util/event.proto`). The first event carries
//! `file_version = "brain.Event:2"`; the others a `Summary` of scalars
//! (`simple_value`) or of one text tensor (the `text` plugin).

use crate::{Error, Result};
use prost::Message;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `tensorflow.Event`, the fields tinylm writes.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
    #[prost(message, optional, tag = "7")]
    pub session_log: Option<SessionLog>,
}

/// `tensorflow.SessionLog`: a `START` at step `s` tells readers that the events of
/// earlier files at steps `>= s` were orphaned by a restart (TensorBoard drops them).
#[derive(Clone, PartialEq, Message)]
pub struct SessionLog {
    /// `SessionStatus`: 1 is `START`.
    #[prost(int32, tag = "1")]
    pub status: i32,
}

const SESSION_START: i32 = 1;

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`: a scalar (`simple_value`) or a tensor with metadata.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    pub tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
}

/// `tensorflow.SummaryMetadata`: which plugin shows the value.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// `tensorflow.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, Message)]
pub struct PluginData {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
}

/// `tensorflow.TensorProto`, as a scalar string tensor.
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    /// `DataType`: 7 is `DT_STRING`.
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    /// A scalar: a shape with no dimensions.
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

/// `tensorflow.TensorShapeProto` (no dimensions: a scalar).
#[derive(Clone, PartialEq, Message)]
pub struct TensorShape {}

const DT_STRING: i32 = 7;

/// TensorFlow's masked CRC-32C of `data`.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One TFRecord around `data`.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The events of an event file's bytes; a truncated or corrupt record is an error naming
/// its byte offset.
pub fn read_events(bytes: &[u8]) -> std::result::Result<Vec<Event>, String> {
    let mut events = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let header = bytes
            .get(at..at + 12)
            .ok_or(format!("truncated record header at byte {at}"))?;
        let len_bytes = &header[..8];
        if u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) != masked_crc(len_bytes) {
            return Err(format!("bad length checksum at byte {at}"));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let data = bytes
            .get(at + 12..at + 12 + len)
            .ok_or(format!("truncated record at byte {at}"))?;
        let crc = bytes
            .get(at + 12 + len..at + 16 + len)
            .ok_or(format!("truncated record at byte {at}"))?;
        if u32::from_le_bytes(crc.try_into().expect("4 bytes")) != masked_crc(data) {
            return Err(format!("bad data checksum at byte {at}"));
        }
        events.push(Event::decode(data).map_err(|e| format!("record at byte {at}: {e}"))?);
        at += 16 + len;
    }
    Ok(events)
}

/// An event file being written; every event reaches the file when it is written.
pub struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// Starts `dir/events.out.tfevents.<seconds>.<host>.<nanoseconds>.<pid>.tinylm`, at
    /// `wall_time` seconds since the Unix epoch. TensorBoard reads every file of a
    /// directory whose name holds `tfevents`, in name order: the time in the name puts
    /// a resumed run's file after the earlier ones (whose events its restart mark
    /// drops), even within one second, and no file is ever overwritten.
    pub fn create(dir: &Path, wall_time: f64) -> Result<EventWriter> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let host = if host.is_empty() {
            "localhost".into()
        } else {
            host
        };
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{:09}.{}.tinylm",
            wall_time as u64,
            (wall_time.fract() * 1e9) as u64,
            std::process::id()
        ));
        let file = File::create_new(&path).map_err(|e| Error::io(&path, e))?;
        let mut writer = EventWriter { file, path };
        writer.write(&Event {
            wall_time,
            file_version: Some("brain.Event:2".into()),
            ..Event::default()
        })?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, event: &Event) -> Result<()> {
        self.file
            .write_all(&record(&event.encode_to_vec()))
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Marks a restart at `step`: readers drop the events of earlier files at steps
    /// `>= step` (those a resumed run logs again).
    pub fn restart(&mut self, step: u64, wall_time: f64) -> Result<()> {
        self.write(&Event {
            wall_time,
            step: step as i64,
            session_log: Some(SessionLog {
                status: SESSION_START,
            }),
            ..Event::default()
        })
    }

    /// Scalars `(tag, value)` at `step`.
    pub fn scalars(&mut self, step: u64, wall_time: f64, values: &[(&str, f64)]) -> Result<()> {
        let value = values
            .iter()
            .map(|&(tag, v)| SummaryValue {
                tag: tag.into(),
                simple_value: Some(v as f32),
                ..SummaryValue::default()
            })
            .collect();
        self.write(&Event {
            wall_time,
            step: step as i64,
            summary: Some(Summary { value }),
            ..Event::default()
        })
    }

    /// `markdown` as the text `tag` at `step` (TensorBoard's Text tab).
    pub fn text(&mut self, tag: &str, step: u64, wall_time: f64, markdown: &str) -> Result<()> {
        let value = SummaryValue {
            tag: tag.into(),
            tensor: Some(TensorProto {
                dtype: DT_STRING,
                tensor_shape: Some(TensorShape {}),
                string_val: vec![markdown.as_bytes().to_vec()],
            }),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "text".into(),
                }),
            }),
            ..SummaryValue::default()
        };
        self.write(&Event {
            wall_time,
            step: step as i64,
            summary: Some(Summary { value: vec![value] }),
            ..Event::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // TensorFlow's crc32c test vectors: crc32c("123456789") = 0xe3069283; masking
        // is a rotation by 15 bits plus 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(
            masked_crc(b"123456789"),
            0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn events_read_back_and_corruption_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path(), 1.7e9).unwrap();
        w.scalars(10, 1.7e9 + 1.0, &[("train/loss", 3.25), ("lr", 1e-3)])
            .unwrap();
        w.text("config", 0, 1.7e9, "| key | value |").unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        let events = read_events(&bytes).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        let scalars = &events[1].summary.as_ref().unwrap().value;
        assert_eq!(
            (
                events[1].step,
                scalars[0].tag.as_str(),
                scalars[0].simple_value
            ),
            (10, "train/loss", Some(3.25))
        );
        let text = events[2].summary.as_ref().unwrap().value[0]
            .tensor
            .as_ref()
            .unwrap();
        assert_eq!(
            (text.dtype, &text.string_val[0][..]),
            (DT_STRING, &b"| key | value |"[..])
        );
        let mut corrupt = bytes.clone();
        let last = corrupt.len() - 6;
        corrupt[last] ^= 1;
        assert!(read_events(&corrupt).unwrap_err().contains("checksum"));
        assert!(read_events(&bytes[..bytes.len() - 1])
            .unwrap_err()
            .contains("truncated"));
    }
}
