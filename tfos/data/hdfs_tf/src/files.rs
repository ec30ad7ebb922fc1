//! Files TF opens: reads (one range stream front to back, a ranged read elsewhere) and buffered writes.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use bytes::Bytes;
use hdfs_native::client::WriteOptions;
use hdfs_native::sync::{FileReadStream, FileReader, FileWriter};
use hdfs_native::HdfsError;

use crate::clients::{hdfs_err, resolve};
use crate::tf::*;

// ---- reading ----

pub(crate) struct Sequential {
    next: u64,
    stream: Option<FileReadStream>,
    left: Bytes,
}

pub(crate) struct ReadFile {
    reader: FileReader,
    length: u64,
    uri: String,
    seq: Mutex<Sequential>,
}

impl ReadFile {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Res<usize> {
        if offset >= self.length || buf.is_empty() {
            return Ok(0);
        }
        let want = buf.len().min((self.length - offset) as usize);
        let mut seq = self.seq.lock().unwrap();
        if seq.next != offset {
            // a read elsewhere: one ranged read; a stream starts if the next read follows it
            *seq = Sequential { next: offset + want as u64, stream: None, left: Bytes::new() };
            let data = self.reader.read_range(offset as usize, want).map_err(|e| hdfs_err(e, &self.uri))?;
            buf[..data.len()].copy_from_slice(&data);
            return Ok(data.len());
        }
        if seq.stream.is_none() && seq.left.is_empty() {
            let rest = (self.length - offset) as usize;
            seq.stream = Some(self.reader.read_range_stream(offset as usize, rest));
        }
        let mut got = 0;
        while got < want {
            if seq.left.is_empty() {
                match seq.stream.as_mut().and_then(|s| s.next()) {
                    Some(Ok(piece)) => seq.left = piece,
                    Some(Err(e)) => {
                        *seq = Sequential { next: u64::MAX, stream: None, left: Bytes::new() };
                        return Err(hdfs_err(e, &self.uri));
                    }
                    None => break,
                }
            }
            let n = seq.left.len().min(want - got);
            buf[got..got + n].copy_from_slice(&seq.left[..n]);
            seq.left = seq.left.slice(n..);
            got += n;
        }
        seq.next = offset + got as u64;
        Ok(got)
    }
}

pub(crate) unsafe extern "C" fn ra_cleanup(file: *mut TF_RandomAccessFile) {
    let f = (*file).plugin_file as *mut ReadFile;
    if !f.is_null() {
        drop(Box::from_raw(f));
        (*file).plugin_file = std::ptr::null_mut();
    }
}

pub(crate) unsafe extern "C" fn ra_read(
    file: *const TF_RandomAccessFile,
    offset: u64,
    n: usize,
    buffer: *mut c_char,
    status: *mut TF_Status,
) -> i64 {
    let f = &*((*file).plugin_file as *const ReadFile);
    let buf = std::slice::from_raw_parts_mut(buffer as *mut u8, n);
    let result = catch_unwind(AssertUnwindSafe(|| f.read(offset, buf)))
        .unwrap_or_else(|_| Err(err(INTERNAL, "tfos hdfs plugin: internal error (a panic)")));
    match result {
        Ok(got) if got < n => {
            set_status(status, Err(err(OUT_OF_RANGE, "Read less bytes than requested")));
            got as i64
        }
        Ok(got) => {
            set_status(status, Ok(()));
            got as i64
        }
        Err(e) => {
            set_status(status, Err(e));
            -1
        }
    }
}

pub(crate) unsafe extern "C" fn new_random_access_file(
    _fs: *const TF_Filesystem,
    path: *const c_char,
    file: *mut TF_RandomAccessFile,
    status: *mut TF_Status,
) {
    guarded(status, || {
        let (c, p, uri) = resolve(path)?;
        let reader = c.read(&p).map_err(|e| hdfs_err(e, &uri))?;
        let length = reader.file_length() as u64;
        let f = ReadFile { reader, length, uri, seq: Mutex::new(Sequential { next: 0, stream: None, left: Bytes::new() }) };
        (*file).plugin_file = Box::into_raw(Box::new(f)) as *mut c_void;
        Ok(())
    })
}

// ---- writing ----

pub(crate) struct WriteState {
    writer: Option<FileWriter>,
    pending: Vec<u8>,
    written: i64,
}

pub(crate) struct WriteFile {
    uri: String,
    state: Mutex<WriteState>,
}

impl WriteFile {
    fn send(&self, st: &mut WriteState) -> Res<()> {
        if st.pending.is_empty() {
            return Ok(());
        }
        let data = Bytes::from(std::mem::take(&mut st.pending));
        let w = st.writer.as_mut().ok_or_else(|| err(FAILED_PRECONDITION, format!("{}: already closed", self.uri)))?;
        w.write_bytes(data).map_err(|e| hdfs_err(e, &self.uri))?;
        Ok(())
    }

    /// ``then`` on the file's state while it is open; nothing (and OK) once it is closed.
    fn while_open(&self, then: impl FnOnce(&mut WriteState) -> Res<()>) -> Res<()> {
        let mut st = self.state.lock().unwrap();
        if st.writer.is_none() {
            return Ok(());
        }
        then(&mut st)
    }
}

pub(crate) unsafe fn wfile<'a>(file: *const TF_WritableFile) -> &'a WriteFile {
    &*((*file).plugin_file as *const WriteFile)
}

pub(crate) unsafe extern "C" fn w_cleanup(file: *mut TF_WritableFile) {
    let f = (*file).plugin_file as *mut WriteFile;
    if !f.is_null() {
        let f = Box::from_raw(f);
        if let Ok(mut st) = f.state.lock() {
            if let Some(mut w) = st.writer.take() {
                let _ = w.close(); // TF closes before cleanup; this is a file it abandoned
            }
        }
        (*file).plugin_file = std::ptr::null_mut();
    }
}

pub(crate) unsafe extern "C" fn w_append(file: *const TF_WritableFile, buffer: *const c_char, n: usize, status: *mut TF_Status) {
    let f = wfile(file);
    guarded(status, || {
        let mut st = f.state.lock().unwrap();
        if st.writer.is_none() {
            return Err(err(FAILED_PRECONDITION, format!("{}: already closed", f.uri)));
        }
        st.pending.extend_from_slice(std::slice::from_raw_parts(buffer as *const u8, n));
        st.written += n as i64;
        if st.pending.len() >= WRITE_PIECE {
            f.send(&mut st)?;
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn w_tell(file: *const TF_WritableFile, status: *mut TF_Status) -> i64 {
    let f = wfile(file);
    guarded(status, || Ok(f.state.lock().unwrap().written))
}

pub(crate) unsafe extern "C" fn w_flush(file: *const TF_WritableFile, status: *mut TF_Status) {
    let f = wfile(file);
    guarded(status, || f.while_open(|st| f.send(st)))
}

pub(crate) unsafe extern "C" fn w_sync(file: *const TF_WritableFile, status: *mut TF_Status) {
    let f = wfile(file);
    guarded(status, || {
        f.while_open(|st| {
            f.send(st)?;
            st.writer.as_mut().unwrap().hsync().map_err(|e| hdfs_err(e, &f.uri))
        })
    })
}

pub(crate) unsafe extern "C" fn w_close(file: *const TF_WritableFile, status: *mut TF_Status) {
    let f = wfile(file);
    guarded(status, || {
        f.while_open(|st| {
            let sent = f.send(st);
            let closed = st.writer.take().unwrap().close().map_err(|e| hdfs_err(e, &f.uri));
            sent.and(closed)
        })
    })
}

pub(crate) unsafe fn open_writer(path: *const c_char, file: *mut TF_WritableFile, append: bool) -> Res<()> {
    let (c, p, uri) = resolve(path)?;
    let length = match c.get_file_info(&p) {
        Ok(st) if st.isdir => return Err(err(FAILED_PRECONDITION, format!("{uri}: is a directory"))),
        Ok(st) => Some(st.length as i64),
        Err(HdfsError::FileNotFound(_)) => None,
        Err(e) => return Err(hdfs_err(e, &uri)),
    };
    let exists = length.is_some();
    let (writer, written) = if let (true, Some(length)) = (append, length) {
        (c.append(&p).map_err(|e| hdfs_err(e, &uri))?, length)
    } else {
        // TF's contract: the parent must exist (create_parent false), an existing file is truncated
        let opts = WriteOptions { overwrite: exists, create_parent: false, ..WriteOptions::default() };
        (c.create(&p, opts).map_err(|e| hdfs_err(e, &uri))?, 0)
    };
    let f = WriteFile { uri, state: Mutex::new(WriteState { writer: Some(writer), pending: Vec::new(), written }) };
    (*file).plugin_file = Box::into_raw(Box::new(f)) as *mut c_void;
    Ok(())
}

pub(crate) unsafe extern "C" fn new_writable_file(
    _fs: *const TF_Filesystem,
    path: *const c_char,
    file: *mut TF_WritableFile,
    status: *mut TF_Status,
) {
    guarded(status, || open_writer(path, file, false))
}

pub(crate) unsafe extern "C" fn new_appendable_file(
    _fs: *const TF_Filesystem,
    path: *const c_char,
    file: *mut TF_WritableFile,
    status: *mut TF_Status,
) {
    guarded(status, || open_writer(path, file, true))
}
