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

mod clients;
mod files;
pub mod tf;

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

use crate::clients::{hdfs_err, info, resolve};
use crate::files::*;
use crate::tf::*;

// ---- the namespace ----

unsafe extern "C" fn fs_init(_fs: *mut TF_Filesystem, status: *mut TF_Status) {
    set_status(status, Ok(()));
}

unsafe extern "C" fn fs_cleanup(_fs: *mut TF_Filesystem) {}

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
