//! hdfs-native clients, one per `scheme://authority`, and HDFS errors as TF status codes.

use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::net::ToSocketAddrs;
use std::sync::{Arc, Mutex, OnceLock};

use hdfs_native::client::FileStatus;
use hdfs_native::sync::{Client, ClientBuilder};
use hdfs_native::HdfsError;

use crate::tf::*;

/// What a user does about an HDFS that asks for Kerberos when this process has no credentials.
const KERBEROS_FIX: &str = "this process has no Kerberos credentials for HDFS: run kinit (or point \
KRB5_CLIENT_KTNAME at a keytab); on YARN give spark-submit --principal and --keytab so that the \
containers get HDFS delegation tokens (HADOOP_TOKEN_FILE_LOCATION)";

pub(crate) fn hdfs_err(e: HdfsError, path: &str) -> Error {
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

// ---- clients, one per scheme://authority ----

/// `(scheme://authority, absolute path)` of a URI; `hdfs:///p` has an empty authority (fs.defaultFS).
pub(crate) fn split_uri(uri: &str) -> Res<(String, String)> {
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
pub(crate) fn client_url(base: &str) -> Option<String> {
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

pub(crate) fn overrides() -> &'static Mutex<HashMap<String, String>> {
    static O: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    O.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(crate) fn client(base: &str) -> Res<Arc<Client>> {
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

pub(crate) fn resolve(uri: *const c_char) -> Res<(Arc<Client>, String, String)> {
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

pub(crate) fn info(path: *const c_char) -> Res<(FileStatus, String)> {
    let (c, p, uri) = resolve(path)?;
    let st = c.get_file_info(&p).map_err(|e| hdfs_err(e, &uri))?;
    Ok((st, uri))
}
