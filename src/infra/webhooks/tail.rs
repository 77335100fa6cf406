//! Reading the instance's own audit file from a cursor, across rotations.
//!
//! A [`Position`] names a place in one file by its inode and offset, and
//! holds the length and SHA-256 of the line that ends there, so that a
//! file cut in place (`logrotate`'s `copytruncate`) is noticed even once
//! it has grown past the offset again.
//!
//! The writer (`events::Audit`) opens its file once per process and never
//! reopens it, so the files to read are at most two: the one the position
//! names, when it is no longer the writer's (renamed away by a rotation
//! before a restart, or the copy `copytruncate` made), then the writer's
//! from its start. The older one is found beside the audit file by its
//! inode, or for a copy by the line before the offset. A rotated file
//! that is gone (deleted, or compressed: keep the newest rotated file
//! uncompressed, `delaycompress`) cannot be read: [`Tail::lost`] says so.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// A place in an audit file: after the line that ends at `offset`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Position {
    /// The file's inode.
    pub(crate) ino: u64,
    /// Bytes from the file's start.
    pub(crate) offset: u64,
    /// The length of the line ending at `offset` (0 at the start).
    pub(crate) last_len: u64,
    /// SHA-256 (hex) of that line ("" at the start).
    pub(crate) last_sha256: String,
}

/// One whole line of the file and the position after it.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    /// The line without its `\n`.
    pub(crate) text: Vec<u8>,
    /// Where it starts in its file.
    pub(crate) start: u64,
    /// The position after it.
    pub(crate) after: Position,
}

/// The reader.
#[derive(Debug)]
pub(crate) struct Tail {
    path: PathBuf,
    writer_ino: u64,
    file: File,
    pos: Position,
    /// Set when lines were lost (a rotated file gone); taken by
    /// [`Tail::lost`].
    lost: bool,
    /// How far the file being read was counted for [`Tail::pending_lines`],
    /// and the lines counted between the position and there.
    counted_to: u64,
    counted: u64,
}

fn sha_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// Whether the line before `pos.offset` in `f` is the one `pos` names.
fn ends_with_line(f: &mut File, pos: &Position) -> std::io::Result<bool> {
    let len = f.metadata()?.len();
    if pos.offset == 0 {
        return Ok(true);
    }
    if pos.last_sha256.is_empty() {
        // A place known only by its offset (a start at the end of a
        // file, an event stream's `Last-Event-ID`): a line must end there.
        if len < pos.offset {
            return Ok(false);
        }
        let mut b = [0u8; 1];
        f.seek(SeekFrom::Start(pos.offset - 1))?;
        f.read_exact(&mut b)?;
        return Ok(b[0] == b'\n');
    }
    if len < pos.offset || pos.last_len + 1 > pos.offset {
        return Ok(false);
    }
    // The line and its `\n`; the line is a capped audit event.
    let Ok(n) = usize::try_from(pos.last_len) else {
        return Ok(false);
    };
    let mut buf = vec![0u8; n + 1];
    f.seek(SeekFrom::Start(pos.offset - pos.last_len - 1))?;
    f.read_exact(&mut buf)?;
    Ok(buf[n] == b'\n' && sha_hex(&buf[..n]) == pos.last_sha256)
}

impl Tail {
    /// Starts at `pos`, or at the end of the writer's file when there is
    /// none (a new subscription: events from now on).
    pub(crate) fn open(path: &Path, pos: Option<Position>) -> std::io::Result<Tail> {
        let mut file = File::open(path)?;
        let meta = file.metadata()?;
        let writer_ino = meta.ino();
        let start = match pos {
            Some(p) => p,
            None => Position {
                ino: writer_ino,
                offset: meta.len(),
                last_len: 0,
                last_sha256: String::new(),
            },
        };
        let mut t = Tail {
            path: path.to_owned(),
            writer_ino,
            file: File::open(path)?,
            pos: start.clone(),
            lost: false,
            counted_to: start.offset,
            counted: 0,
        };
        if start.ino == writer_ino && ends_with_line(&mut file, &start)? {
            return Ok(t);
        }
        t.find_older()?;
        Ok(t)
    }

    /// For a live stream: at `ino`/`offset` when a line of the file the
    /// writer writes ends there, else at its end (never from an older
    /// file: a client resuming after a rotation gets what comes next).
    pub(crate) fn resume(path: &Path, at: Option<(u64, u64)>) -> std::io::Result<Tail> {
        let mut t = Tail::open(path, None)?;
        if let Some((ino, offset)) = at {
            let pos = Position {
                ino,
                offset,
                last_len: 0,
                last_sha256: String::new(),
            };
            if ino == t.writer_ino && ends_with_line(&mut t.file, &pos)? {
                t.pos = pos;
                t.counted_to = offset;
            }
        }
        Ok(t)
    }

    /// Where the next line starts.
    pub(crate) fn position(&self) -> &Position {
        &self.pos
    }

    /// Whether lines were lost since the last call (a rotated file that
    /// could not be found).
    pub(crate) fn lost(&mut self) -> bool {
        std::mem::take(&mut self.lost)
    }

    /// Finds the file holding `pos` beside the audit file (not the
    /// writer's); when none does, goes on at the writer's file's start and
    /// notes the loss.
    fn find_older(&mut self) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let stem = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut found = None;
        for entry in std::fs::read_dir(dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&stem) || name.ends_with(".gz") {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() || meta.ino() == self.writer_ino {
                continue;
            }
            let Ok(mut f) = File::open(entry.path()) else {
                continue;
            };
            // Renamed away: the same inode. Copied (copytruncate): the
            // same line before the offset.
            let same = meta.ino() == self.pos.ino && ends_with_line(&mut f, &self.pos)?;
            let copy = self.pos.offset > 0
                && !self.pos.last_sha256.is_empty()
                && ends_with_line(&mut f, &self.pos)?;
            if same || copy {
                found = Some((f, meta.ino()));
                break;
            }
        }
        match found {
            Some((f, ino)) => {
                self.file = f;
                self.pos.ino = ino;
                self.counted_to = self.pos.offset;
                self.counted = 0;
            }
            None => {
                self.lost = self.pos.offset > 0;
                self.restart_at_writer()?;
            }
        }
        Ok(())
    }

    fn restart_at_writer(&mut self) -> std::io::Result<()> {
        self.file = File::open(&self.path)?;
        if self.file.metadata()?.ino() != self.writer_ino {
            // The path was replaced again meanwhile: read the writer's file
            // through the process's own descriptor is not possible here, so
            // the path's file is read; the next open resolves it.
            self.writer_ino = self.file.metadata()?.ino();
        }
        self.pos = Position {
            ino: self.writer_ino,
            offset: 0,
            last_len: 0,
            last_sha256: String::new(),
        };
        self.counted_to = 0;
        self.counted = 0;
        Ok(())
    }

    /// Whole lines not yet read in the file being read (each byte is
    /// counted once, as it arrives).
    pub(crate) fn pending_lines(&mut self) -> std::io::Result<u64> {
        let len = self.file.metadata()?.len();
        if len < self.counted_to {
            return Ok(self.counted);
        }
        let mut buf = vec![0u8; 1 << 20];
        self.file.seek(SeekFrom::Start(self.counted_to))?;
        while self.counted_to < len {
            let n = usize::try_from((len - self.counted_to).min(1 << 20)).unwrap_or(1 << 20);
            self.file.read_exact(&mut buf[..n])?;
            self.counted += memchr::memchr_iter(b'\n', &buf[..n]).count() as u64;
            self.counted_to += n as u64;
        }
        Ok(self.counted)
    }

    /// Bytes not yet read: the rest of the file being read, and the
    /// writer's whole file when that is another.
    pub(crate) fn backlog_bytes(&self) -> u64 {
        let here = self
            .file
            .metadata()
            .map_or(0, |m| m.len().saturating_sub(self.pos.offset));
        if self.pos.ino == self.writer_ino {
            here
        } else {
            here + std::fs::metadata(&self.path).map_or(0, |m| m.len())
        }
    }

    /// Up to `max` whole lines from the position, advancing it; an empty
    /// list when nothing new was written.
    pub(crate) fn read(&mut self, max: usize) -> std::io::Result<Vec<Line>> {
        let len = self.file.metadata()?.len();
        if self.pos.ino == self.writer_ino
            && (len < self.pos.offset || !ends_with_line(&mut self.file, &self.pos)?)
        {
            // Cut in place (copytruncate): go on in the copy, if any.
            self.find_older()?;
            return self.read(max);
        }
        if len == self.pos.offset {
            if self.pos.ino != self.writer_ino {
                // An older file read to its end: the writer's is next.
                self.restart_at_writer()?;
                return Ok(Vec::new());
            }
            return Ok(Vec::new());
        }
        let want = (len - self.pos.offset).min(1 << 20);
        let mut buf = vec![0u8; usize::try_from(want).unwrap_or(1 << 20)];
        self.file.seek(SeekFrom::Start(self.pos.offset))?;
        self.file.read_exact(&mut buf)?;
        let mut out = Vec::new();
        let mut at = 0usize;
        while out.len() < max {
            let Some(nl) = memchr::memchr(b'\n', &buf[at..]) else {
                break;
            };
            let text = buf[at..at + nl].to_vec();
            let start = self.pos.offset;
            let line_len = nl as u64;
            self.pos = Position {
                ino: self.pos.ino,
                offset: start + line_len + 1,
                last_len: line_len,
                last_sha256: sha_hex(&text),
            };
            if self.pos.offset <= self.counted_to {
                self.counted = self.counted.saturating_sub(1);
            } else {
                self.counted_to = self.pos.offset;
                self.counted = 0;
            }
            out.push(Line {
                text,
                start,
                after: self.pos.clone(),
            });
            at += nl + 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(p: &Path, s: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap();
        f.write_all(s.as_bytes()).unwrap();
    }

    fn texts(v: &[Line]) -> Vec<String> {
        v.iter()
            .map(|l| String::from_utf8(l.text.clone()).unwrap())
            .collect()
    }

    #[test]
    fn a_copytruncate_rotation_loses_no_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("audit.jsonl");
        append(&p, "a\nb\n");
        let mut t = Tail::open(&p, None).unwrap();
        append(&p, "c\nd\n");
        let first = t.read(1).unwrap();
        assert_eq!(texts(&first), ["c"]);
        let pos = t.position().clone();
        // Rotation: copy, then cut in place; then the writer goes on.
        std::fs::copy(&p, d.path().join("audit.jsonl.1")).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(0)
            .unwrap();
        append(&p, "e\nfff\ng\n");
        // A restart from the stored position.
        let mut t = Tail::open(&p, Some(pos)).unwrap();
        let mut all = Vec::new();
        for _ in 0..5 {
            all.extend(texts(&t.read(10).unwrap()));
        }
        assert_eq!(all, ["d", "e", "fff", "g"]);
        assert!(!t.lost());
    }

    #[test]
    fn a_rename_rotation_before_a_restart_loses_no_line_and_a_deleted_one_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("audit.jsonl");
        append(&p, "a\n");
        let mut t = Tail::open(&p, None).unwrap();
        append(&p, "b\nc\n");
        assert_eq!(texts(&t.read(1).unwrap()), ["b"]);
        let pos = t.position().clone();
        std::fs::rename(&p, d.path().join("audit.jsonl.1")).unwrap();
        append(&p, "d\n");
        let mut t = Tail::open(&p, Some(pos.clone())).unwrap();
        let mut all = Vec::new();
        for _ in 0..4 {
            all.extend(texts(&t.read(10).unwrap()));
        }
        assert_eq!(all, ["c", "d"]);
        assert!(!t.lost());
        // The rotated file deleted: the loss is reported, and reading goes
        // on at the start of the current file.
        std::fs::remove_file(d.path().join("audit.jsonl.1")).unwrap();
        let mut t = Tail::open(&p, Some(pos)).unwrap();
        assert!(t.lost());
        assert_eq!(texts(&t.read(10).unwrap()), ["d"]);
    }

    #[test]
    fn a_partial_last_line_waits_for_its_end() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("audit.jsonl");
        append(&p, "");
        let mut t = Tail::open(&p, None).unwrap();
        append(&p, "x\nhal");
        assert_eq!(texts(&t.read(10).unwrap()), ["x"]);
        assert!(t.read(10).unwrap().is_empty());
        append(&p, "f\n");
        assert_eq!(texts(&t.read(10).unwrap()), ["half"]);
    }
}
