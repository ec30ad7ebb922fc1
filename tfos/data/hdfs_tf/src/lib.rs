//! A TensorFlow modular filesystem plugin (TensorFlow's C API `filesystem_interface.h`) for the
//! `hdfs://` and `viewfs://` schemes, on hdfs-native: HDFS's RPC and data-transfer protocols in
//! Rust, so no JVM, no libhdfs and no Hadoop install. Kerberos and NameNode HA come from
//! `$HADOOP_CONF_DIR` as hdfs-native reads them.
//!
//! Loaded into a TF process by `tf.experimental.register_filesystem_plugin` (tfos does it in
//! `tfos.data.tfhdfs.register`). Every operation blocks the calling TF thread on hdfs-native's
//! own runtime. A file read front to back is served from one range stream (the next packets are
//! in flight while TF parses the last ones); a read elsewhere in the file is a single ranged read.
//! Writes are buffered and sent in pieces of `WRITE_PIECE`; a file is complete on HDFS when TF
//! closes it.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::net::ToSocketAddrs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use hdfs_native::client::WriteOptions;
use hdfs_native::sync::{Client, ClientBuilder, FileReadStream, FileReader, FileWriter};
use hdfs_native::HdfsError;

// ---- TensorFlow's C types (filesystem_interface.h, tf_file_statistics.h, tf_status.h) ----

#[repr(C)]
pub struct TF_Status {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct TF_FileStatistics {
    length: i64,
    mtime_nsec: i64,
    is_directory: bool,
}

#[repr(C)]
pub struct TF_RandomAccessFile {
    plugin_file: *mut c_void,
}

#[repr(C)]
pub struct TF_WritableFile {
    plugin_file: *mut c_void,
}

#[repr(C)]
pub struct TF_Filesystem {
    plugin_filesystem: *mut c_void,
}

type Unused = Option<unsafe extern "C" fn()>;

#[repr(C)]
struct TF_RandomAccessFileOps {
    cleanup: Option<unsafe extern "C" fn(*mut TF_RandomAccessFile)>,
    read: Option<unsafe extern "C" fn(*const TF_RandomAccessFile, u64, usize, *mut c_char, *mut TF_Status) -> i64>,
}

#[repr(C)]
struct TF_WritableFileOps {
    cleanup: Option<unsafe extern "C" fn(*mut TF_WritableFile)>,
    append: Option<unsafe extern "C" fn(*const TF_WritableFile, *const c_char, usize, *mut TF_Status)>,
    tell: Option<unsafe extern "C" fn(*const TF_WritableFile, *mut TF_Status) -> i64>,
    flush: Option<unsafe extern "C" fn(*const TF_WritableFile, *mut TF_Status)>,
    sync: Option<unsafe extern "C" fn(*const TF_WritableFile, *mut TF_Status)>,
    close: Option<unsafe extern "C" fn(*const TF_WritableFile, *mut TF_Status)>,
}

#[repr(C)]
struct TF_ReadOnlyMemoryRegionOps {
    cleanup: Unused,
    data: Unused,
    length: Unused,
}

type PathOp = Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_Status)>;

#[repr(C)]
struct TF_FilesystemOps {
    init: Option<unsafe extern "C" fn(*mut TF_Filesystem, *mut TF_Status)>,
    cleanup: Option<unsafe extern "C" fn(*mut TF_Filesystem)>,
    new_random_access_file:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_RandomAccessFile, *mut TF_Status)>,
    new_writable_file:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_WritableFile, *mut TF_Status)>,
    new_appendable_file:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_WritableFile, *mut TF_Status)>,
    new_read_only_memory_region_from_file: Unused,
    create_dir: PathOp,
    recursively_create_dir: PathOp,
    delete_file: PathOp,
    delete_dir: PathOp,
    delete_recursively:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut u64, *mut u64, *mut TF_Status)>,
    rename_file: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *const c_char, *mut TF_Status)>,
    copy_file: Unused,
    path_exists: PathOp,
    paths_exist: Unused,
    stat: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_FileStatistics, *mut TF_Status)>,
    is_directory: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_Status) -> bool>,
    get_file_size: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_Status) -> i64>,
    translate_name: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char) -> *mut c_char>,
    get_children:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut *mut *mut c_char, *mut TF_Status) -> c_int>,
    get_matching_paths: Unused,
    flush_caches: Unused,
    start_transaction: Unused,
    end_transaction: Unused,
    add_to_transaction: Unused,
    get_transaction_for_path: Unused,
    get_or_start_transaction_for_path: Unused,
    decode_transaction_token: Unused,
    get_filesystem_configuration: Unused,
    set_filesystem_configuration: Unused,
    get_filesystem_configuration_option: Unused,
    set_filesystem_configuration_option: Unused,
    get_filesystem_configuration_keys: Unused,
}

#[repr(C)]
pub struct TF_FilesystemPluginOps {
    scheme: *mut c_char,
    filesystem_ops_abi: c_int,
    filesystem_ops_api: c_int,
    filesystem_ops_size: usize,
    filesystem_ops: *mut TF_FilesystemOps,
    random_access_file_ops_abi: c_int,
    random_access_file_ops_api: c_int,
    random_access_file_ops_size: usize,
    random_access_file_ops: *mut TF_RandomAccessFileOps,
    writable_file_ops_abi: c_int,
    writable_file_ops_api: c_int,
    writable_file_ops_size: usize,
    writable_file_ops: *mut TF_WritableFileOps,
    read_only_memory_region_ops_abi: c_int,
    read_only_memory_region_ops_api: c_int,
    read_only_memory_region_ops_size: usize,
    read_only_memory_region_ops: *mut TF_ReadOnlyMemoryRegionOps,
}

#[repr(C)]
pub struct TF_FilesystemPluginInfo {
    num_schemes: usize,
    ops: *mut TF_FilesystemPluginOps,
    plugin_memory_allocate: Option<unsafe extern "C" fn(usize) -> *mut c_void>,
    plugin_memory_free: Option<unsafe extern "C" fn(*mut c_void)>,
}

extern "C" {
    fn TF_SetStatus(status: *mut TF_Status, code: c_int, msg: *const c_char);
}

// TF_Code values (tf_status.h)
const OK: c_int = 0;
const UNKNOWN: c_int = 2;
const INVALID_ARGUMENT: c_int = 3;
const NOT_FOUND: c_int = 5;
const ALREADY_EXISTS: c_int = 6;
const PERMISSION_DENIED: c_int = 7;
const FAILED_PRECONDITION: c_int = 9;
const OUT_OF_RANGE: c_int = 11;
const UNIMPLEMENTED: c_int = 12;
const INTERNAL: c_int = 13;
const UNAVAILABLE: c_int = 14;
const UNAUTHENTICATED: c_int = 16;

/// Bytes an open file for writing holds before they go to HDFS.
const WRITE_PIECE: usize = 4 << 20;

/// What a user does about an HDFS that asks for Kerberos when this process has no credentials.
const KERBEROS_FIX: &str = "this process has no Kerberos credentials for HDFS: run kinit (or point \
KRB5_CLIENT_KTNAME at a keytab); on YARN give spark-submit --principal and --keytab so that the \
containers get HDFS delegation tokens (HADOOP_TOKEN_FILE_LOCATION)";

struct Error {
    code: c_int,
    msg: String,
}

type Res<T> = Result<T, Error>;

fn err(code: c_int, msg: impl Into<String>) -> Error {
    Error { code, msg: msg.into() }
}

fn hdfs_err(e: HdfsError, path: &str) -> Error {
    let text = e.to_string();
    let code = match &e {
        HdfsError::FileNotFound(_) => NOT_FOUND,
        HdfsError::AlreadyExists(_) => ALREADY_EXISTS,
        HdfsError::IsADirectoryError(_) => FAILED_PRECONDITION,
        HdfsError::InvalidPath(_) | HdfsError::InvalidArgument(_) | HdfsError::UrlParseError(_) => INVALID_ARGUMENT,
        HdfsError::UnsupportedFeature(_) => UNIMPLEMENTED,
        HdfsError::GSSAPIError(..) | HdfsError::NoSASLMechanism | HdfsError::SASLError(_) => UNAUTHENTICATED,
        HdfsError::IOError(_) | HdfsError::DataTransferError(_) | HdfsError::BlocksNotFound(_) => UNAVAILABLE,
        HdfsError::RPCError(class, _) | HdfsError::FatalRPCError(class, _) => match class.as_str() {
            "java.io.FileNotFoundException" => NOT_FOUND,
            "org.apache.hadoop.security.AccessControlException" => PERMISSION_DENIED,
            "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException"
            | "org.apache.hadoop.fs.ParentNotDirectoryException" => FAILED_PRECONDITION,
            _ => UNKNOWN,
        },
        _ => UNKNOWN,
    };
    if code == UNAUTHENTICATED || text.contains("GSS_S_NO_CRED") {
        return err(UNAUTHENTICATED, format!("{path}: {KERBEROS_FIX}. hdfs-native said: {text}"));
    }
    err(code, format!("{path}: {text}"))
}

unsafe fn set_status(status: *mut TF_Status, result: Res<()>) {
    match result {
        Ok(()) => TF_SetStatus(status, OK, c"".as_ptr()),
        Err(e) => {
            let msg = CString::new(e.msg.replace('\0', " ")).unwrap_or_default();
            TF_SetStatus(status, e.code, msg.as_ptr());
        }
    }
}

/// Runs `f` with TF's status set from its result; a panic becomes INTERNAL and never unwinds into TF.
unsafe fn guarded<T: Default>(status: *mut TF_Status, f: impl FnOnce() -> Res<T>) -> T {
    let result = catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(err(INTERNAL, "tfos hdfs plugin: internal error (a panic; see stderr)")));
    match result {
        Ok(v) => {
            set_status(status, Ok(()));
            v
        }
        Err(e) => {
            set_status(status, Err(e));
            T::default()
        }
    }
}

unsafe fn c_str<'a>(p: *const c_char) -> Res<&'a str> {
    if p.is_null() {
        return Err(err(INVALID_ARGUMENT, "null path"));
    }
    CStr::from_ptr(p).to_str().map_err(|_| err(INVALID_ARGUMENT, "path is not UTF-8"))
}

// ---- clients, one per scheme://authority ----

/// `(scheme://authority, absolute path)` of a URI; `hdfs:///p` has an empty authority (fs.defaultFS).
fn split_uri(uri: &str) -> Res<(String, String)> {
    let (scheme, rest) = uri.split_once("://").ok_or_else(|| err(INVALID_ARGUMENT, format!("not a URI: {uri}")))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    Ok((format!("{scheme}://{authority}"), if path.is_empty() { "/".into() } else { path.into() }))
}

/// The URL hdfs-native connects to for `base`. Hadoop names a non-HA NameNode's delegation tokens
/// by address, and hdfs-native looks its token up by its URL's `host:port` as written, so with a
/// token file (a YARN container) a NameNode named by host name is connected to by address (the
/// rule of `tfos.data.hdfs.client_url`). `hdfs://` alone is fs.defaultFS, or what tfos set for it.
fn client_url(base: &str) -> Option<String> {
    if let Some(url) = overrides().lock().unwrap().get(base) {
        return Some(url.clone());
    }
    let authority = base.split_once("://").map(|(_, a)| a).unwrap_or("");
    if authority.is_empty() {
        return None;
    }
    if base.starts_with("hdfs://") && std::env::var_os("HADOOP_TOKEN_FILE_LOCATION").is_some() {
        if let Some((host, port)) = authority.rsplit_once(':') {
            if host.parse::<std::net::IpAddr>().is_err() && port.parse::<u16>().is_ok() {
                if let Ok(mut addrs) = (host, port.parse::<u16>().unwrap()).to_socket_addrs() {
                    if let Some(a) = addrs.find(|a| a.is_ipv4()) {
                        return Some(format!("hdfs://{}:{}", a.ip(), port));
                    }
                }
            }
        }
    }
    Some(base.to_string())
}

fn overrides() -> &'static Mutex<HashMap<String, String>> {
    static O: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    O.get_or_init(|| Mutex::new(HashMap::new()))
}

fn client(base: &str) -> Res<Arc<Client>> {
    static CLIENTS: OnceLock<Mutex<HashMap<String, Arc<Client>>>> = OnceLock::new();
    let clients = CLIENTS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = clients.lock().unwrap();
    if let Some(c) = map.get(base) {
        return Ok(Arc::clone(c));
    }
    let mut builder = ClientBuilder::new();
    if let Some(url) = client_url(base) {
        builder = builder.with_url(url);
    }
    let c = Arc::new(builder.build().map_err(|e| {
        err(
            FAILED_PRECONDITION,
            format!("cannot connect to {base}: {e}. Set HADOOP_CONF_DIR to the cluster's configuration \
                     (core-site.xml with fs.defaultFS, hdfs-site.xml)"),
        )
    })?);
    map.insert(base.to_string(), Arc::clone(&c));
    Ok(c)
}

fn resolve(uri: *const c_char) -> Res<(Arc<Client>, String, String)> {
    let uri = unsafe { c_str(uri)? };
    let (base, path) = split_uri(uri)?;
    Ok((client(&base)?, path, uri.to_string()))
}

/// Sets the URL that `base` (`hdfs://` for fs.defaultFS, or `scheme://authority`) connects to.
/// tfos calls it through ctypes after registering the plugin. Returns 0, or -1 for bad arguments.
#[no_mangle]
pub unsafe extern "C" fn tfos_hdfs_set_client_url(base: *const c_char, url: *const c_char) -> c_int {
    match (c_str(base), c_str(url)) {
        (Ok(b), Ok(u)) => {
            overrides().lock().unwrap().insert(b.to_string(), u.to_string());
            0
        }
        _ => -1,
    }
}

// ---- reading ----

struct Sequential {
    next: u64,
    stream: Option<FileReadStream>,
    left: Bytes,
}

struct ReadFile {
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

unsafe extern "C" fn ra_cleanup(file: *mut TF_RandomAccessFile) {
    let f = (*file).plugin_file as *mut ReadFile;
    if !f.is_null() {
        drop(Box::from_raw(f));
        (*file).plugin_file = std::ptr::null_mut();
    }
}

unsafe extern "C" fn ra_read(
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

unsafe extern "C" fn new_random_access_file(
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

struct WriteState {
    writer: Option<FileWriter>,
    pending: Vec<u8>,
    written: i64,
}

struct WriteFile {
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
}

unsafe fn wfile<'a>(file: *const TF_WritableFile) -> &'a WriteFile {
    &*((*file).plugin_file as *const WriteFile)
}

unsafe extern "C" fn w_cleanup(file: *mut TF_WritableFile) {
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

unsafe extern "C" fn w_append(file: *const TF_WritableFile, buffer: *const c_char, n: usize, status: *mut TF_Status) {
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

unsafe extern "C" fn w_tell(file: *const TF_WritableFile, status: *mut TF_Status) -> i64 {
    let f = wfile(file);
    guarded(status, || Ok(f.state.lock().unwrap().written))
}

unsafe extern "C" fn w_flush(file: *const TF_WritableFile, status: *mut TF_Status) {
    let f = wfile(file);
    guarded(status, || {
        let mut st = f.state.lock().unwrap();
        if st.writer.is_none() {
            return Ok(());
        }
        f.send(&mut st)
    })
}

unsafe extern "C" fn w_sync(file: *const TF_WritableFile, status: *mut TF_Status) {
    let f = wfile(file);
    guarded(status, || {
        let mut st = f.state.lock().unwrap();
        if st.writer.is_none() {
            return Ok(());
        }
        f.send(&mut st)?;
        st.writer.as_mut().unwrap().hsync().map_err(|e| hdfs_err(e, &f.uri))
    })
}

unsafe extern "C" fn w_close(file: *const TF_WritableFile, status: *mut TF_Status) {
    let f = wfile(file);
    guarded(status, || {
        let mut st = f.state.lock().unwrap();
        if st.writer.is_none() {
            return Ok(());
        }
        let sent = f.send(&mut st);
        let mut w = st.writer.take().unwrap();
        let closed = w.close().map_err(|e| hdfs_err(e, &f.uri));
        sent.and(closed)
    })
}

unsafe fn open_writer(path: *const c_char, file: *mut TF_WritableFile, append: bool) -> Res<()> {
    let (c, p, uri) = resolve(path)?;
    let exists = match c.get_file_info(&p) {
        Ok(st) if st.isdir => return Err(err(FAILED_PRECONDITION, format!("{uri}: is a directory"))),
        Ok(_) => true,
        Err(HdfsError::FileNotFound(_)) => false,
        Err(e) => return Err(hdfs_err(e, &uri)),
    };
    let (writer, written) = if append && exists {
        let length = c.get_file_info(&p).map_err(|e| hdfs_err(e, &uri))?.length as i64;
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

unsafe extern "C" fn new_writable_file(
    _fs: *const TF_Filesystem,
    path: *const c_char,
    file: *mut TF_WritableFile,
    status: *mut TF_Status,
) {
    guarded(status, || open_writer(path, file, false))
}

unsafe extern "C" fn new_appendable_file(
    _fs: *const TF_Filesystem,
    path: *const c_char,
    file: *mut TF_WritableFile,
    status: *mut TF_Status,
) {
    guarded(status, || open_writer(path, file, true))
}

// ---- the namespace ----

unsafe extern "C" fn fs_init(_fs: *mut TF_Filesystem, status: *mut TF_Status) {
    set_status(status, Ok(()));
}

unsafe extern "C" fn fs_cleanup(_fs: *mut TF_Filesystem) {}

fn info(path: *const c_char) -> Res<(hdfs_native::client::FileStatus, String)> {
    let (c, p, uri) = resolve(path)?;
    let st = c.get_file_info(&p).map_err(|e| hdfs_err(e, &uri))?;
    Ok((st, uri))
}

unsafe extern "C" fn create_dir(_fs: *const TF_Filesystem, path: *const c_char, status: *mut TF_Status) {
    guarded(status, || {
        let (c, p, uri) = resolve(path)?;
        if c.get_file_info(&p).is_ok() {
            return Err(err(ALREADY_EXISTS, format!("{uri}: already exists")));
        }
        c.mkdirs(&p, 0o755, false).map_err(|e| hdfs_err(e, &uri))
    })
}

unsafe extern "C" fn recursively_create_dir(_fs: *const TF_Filesystem, path: *const c_char, status: *mut TF_Status) {
    guarded(status, || {
        let (c, p, uri) = resolve(path)?;
        c.mkdirs(&p, 0o755, true).map_err(|e| hdfs_err(e, &uri))
    })
}

unsafe extern "C" fn delete_file(_fs: *const TF_Filesystem, path: *const c_char, status: *mut TF_Status) {
    guarded(status, || {
        let (c, p, uri) = resolve(path)?;
        let st = c.get_file_info(&p).map_err(|e| hdfs_err(e, &uri))?;
        if st.isdir {
            return Err(err(FAILED_PRECONDITION, format!("{uri}: is a directory")));
        }
        match c.delete(&p, false).map_err(|e| hdfs_err(e, &uri))? {
            true => Ok(()),
            false => Err(err(NOT_FOUND, format!("{uri}: not found"))),
        }
    })
}

unsafe extern "C" fn delete_dir(_fs: *const TF_Filesystem, path: *const c_char, status: *mut TF_Status) {
    guarded(status, || {
        let (c, p, uri) = resolve(path)?;
        let st = c.get_file_info(&p).map_err(|e| hdfs_err(e, &uri))?;
        if !st.isdir {
            return Err(err(FAILED_PRECONDITION, format!("{uri}: not a directory")));
        }
        c.delete(&p, false).map_err(|e| hdfs_err(e, &uri)).map(|_| ())
    })
}

unsafe extern "C" fn delete_recursively(
    _fs: *const TF_Filesystem,
    path: *const c_char,
    undeleted_files: *mut u64,
    undeleted_dirs: *mut u64,
    status: *mut TF_Status,
) {
    *undeleted_files = 0;
    *undeleted_dirs = 0;
    let result = guarded(status, || {
        let (c, p, uri) = resolve(path)?;
        c.get_file_info(&p).map_err(|e| hdfs_err(e, &uri))?;
        c.delete(&p, true).map_err(|e| hdfs_err(e, &uri))?;
        Ok(true)
    });
    if !result {
        *undeleted_dirs = 1;
    }
}

unsafe extern "C" fn rename_file(_fs: *const TF_Filesystem, src: *const c_char, dst: *const c_char, status: *mut TF_Status) {
    guarded(status, || {
        let (c, from, uri) = resolve(src)?;
        let (c2, to, _) = resolve(dst)?;
        if !Arc::ptr_eq(&c, &c2) {
            return Err(err(UNIMPLEMENTED, format!("{uri}: rename across file systems")));
        }
        c.rename(&from, &to, true).map_err(|e| hdfs_err(e, &uri))
    })
}

unsafe extern "C" fn path_exists(_fs: *const TF_Filesystem, path: *const c_char, status: *mut TF_Status) {
    guarded(status, || info(path).map(|_| ()))
}

unsafe extern "C" fn stat(_fs: *const TF_Filesystem, path: *const c_char, stats: *mut TF_FileStatistics, status: *mut TF_Status) {
    guarded(status, || {
        let (st, _) = info(path)?;
        (*stats).length = if st.isdir { 0 } else { st.length as i64 };
        (*stats).mtime_nsec = st.modification_time as i64 * 1_000_000;
        (*stats).is_directory = st.isdir;
        Ok(())
    })
}

unsafe extern "C" fn is_directory(_fs: *const TF_Filesystem, path: *const c_char, status: *mut TF_Status) -> bool {
    guarded(status, || {
        let (st, uri) = info(path)?;
        if st.isdir {
            Ok(true)
        } else {
            Err(err(FAILED_PRECONDITION, format!("{uri}: not a directory")))
        }
    })
}

unsafe extern "C" fn get_file_size(_fs: *const TF_Filesystem, path: *const c_char, status: *mut TF_Status) -> i64 {
    guarded(status, || {
        let (st, uri) = info(path)?;
        if st.isdir {
            return Err(err(FAILED_PRECONDITION, format!("{uri}: is a directory")));
        }
        Ok(st.length as i64)
    })
}

unsafe extern "C" fn get_children(
    _fs: *const TF_Filesystem,
    path: *const c_char,
    entries: *mut *mut *mut c_char,
    status: *mut TF_Status,
) -> c_int {
    *entries = std::ptr::null_mut();
    let mut failed = true;
    let n = guarded(status, || {
        let (c, p, uri) = resolve(path)?;
        let st = c.get_file_info(&p).map_err(|e| hdfs_err(e, &uri))?;
        if !st.isdir {
            return Err(err(FAILED_PRECONDITION, format!("{uri}: not a directory")));
        }
        let names: Vec<String> = c
            .list_status(&p, false)
            .map_err(|e| hdfs_err(e, &uri))?
            .into_iter()
            .map(|s| s.path.rsplit('/').next().unwrap_or("").to_string())
            .filter(|n| !n.is_empty())
            .collect();
        // TF frees the array and each name with plugin_memory_free (libc free)
        let array = libc::malloc(names.len().max(1) * std::mem::size_of::<*mut c_char>()) as *mut *mut c_char;
        if array.is_null() {
            return Err(err(INTERNAL, "out of memory"));
        }
        for (i, n) in names.iter().enumerate() {
            let cs = CString::new(n.as_str()).unwrap_or_default();
            *array.add(i) = libc::strdup(cs.as_ptr());
        }
        *entries = array;
        failed = false;
        Ok(names.len() as c_int)
    });
    if failed { -1 } else { n }
}

/// The name every operation gets: the URI as given (TF's default keeps only its path, and the
/// authority names the cluster).
unsafe extern "C" fn translate_name(_fs: *const TF_Filesystem, uri: *const c_char) -> *mut c_char {
    libc::strdup(uri)
}

// ---- registration ----

unsafe extern "C" fn allocate(size: usize) -> *mut c_void {
    libc::malloc(size)
}

unsafe extern "C" fn free(ptr: *mut c_void) {
    libc::free(ptr)
}

unsafe fn boxed_c<T>(value: T) -> *mut T {
    let p = libc::malloc(std::mem::size_of::<T>()) as *mut T;
    p.write(value);
    p
}

fn filesystem_ops() -> TF_FilesystemOps {
    TF_FilesystemOps {
        init: Some(fs_init),
        cleanup: Some(fs_cleanup),
        new_random_access_file: Some(new_random_access_file),
        new_writable_file: Some(new_writable_file),
        new_appendable_file: Some(new_appendable_file),
        new_read_only_memory_region_from_file: None,
        create_dir: Some(create_dir),
        recursively_create_dir: Some(recursively_create_dir),
        delete_file: Some(delete_file),
        delete_dir: Some(delete_dir),
        delete_recursively: Some(delete_recursively),
        rename_file: Some(rename_file),
        copy_file: None,
        path_exists: Some(path_exists),
        paths_exist: None,
        stat: Some(stat),
        is_directory: Some(is_directory),
        get_file_size: Some(get_file_size),
        translate_name: Some(translate_name),
        get_children: Some(get_children),
        get_matching_paths: None,
        flush_caches: None,
        start_transaction: None,
        end_transaction: None,
        add_to_transaction: None,
        get_transaction_for_path: None,
        get_or_start_transaction_for_path: None,
        decode_transaction_token: None,
        get_filesystem_configuration: None,
        set_filesystem_configuration: None,
        get_filesystem_configuration_option: None,
        set_filesystem_configuration_option: None,
        get_filesystem_configuration_keys: None,
    }
}

/// TensorFlow's entry point: registers `hdfs` and `viewfs` (ABI/API 0 of every table).
#[no_mangle]
pub unsafe extern "C" fn TF_InitPlugin(info: *mut TF_FilesystemPluginInfo) {
    let schemes = ["hdfs", "viewfs"];
    (*info).plugin_memory_allocate = Some(allocate);
    (*info).plugin_memory_free = Some(free);
    (*info).num_schemes = schemes.len();
    let ops = libc::malloc(schemes.len() * std::mem::size_of::<TF_FilesystemPluginOps>()) as *mut TF_FilesystemPluginOps;
    for (i, scheme) in schemes.iter().enumerate() {
        let name = CString::new(*scheme).unwrap();
        ops.add(i).write(TF_FilesystemPluginOps {
            scheme: libc::strdup(name.as_ptr()),
            filesystem_ops_abi: 0,
            filesystem_ops_api: 0,
            filesystem_ops_size: std::mem::size_of::<TF_FilesystemOps>(),
            filesystem_ops: boxed_c(filesystem_ops()),
            random_access_file_ops_abi: 0,
            random_access_file_ops_api: 0,
            random_access_file_ops_size: std::mem::size_of::<TF_RandomAccessFileOps>(),
            random_access_file_ops: boxed_c(TF_RandomAccessFileOps { cleanup: Some(ra_cleanup), read: Some(ra_read) }),
            writable_file_ops_abi: 0,
            writable_file_ops_api: 0,
            writable_file_ops_size: std::mem::size_of::<TF_WritableFileOps>(),
            writable_file_ops: boxed_c(TF_WritableFileOps {
                cleanup: Some(w_cleanup),
                append: Some(w_append),
                tell: Some(w_tell),
                flush: Some(w_flush),
                sync: Some(w_sync),
                close: Some(w_close),
            }),
            read_only_memory_region_ops_abi: 0,
            read_only_memory_region_ops_api: 0,
            read_only_memory_region_ops_size: 0,
            read_only_memory_region_ops: std::ptr::null_mut(),
        });
    }
    (*info).ops = ops;
}
