//! TensorFlow's C filesystem API as Rust sees it (filesystem_interface.h, tf_file_statistics.h,
//! tf_status.h), and how an operation reports to TF: a status, never a panic across the boundary.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

// ---- TensorFlow's C types (filesystem_interface.h, tf_file_statistics.h, tf_status.h) ----

#[repr(C)]
pub(crate) struct TF_Status {
    pub(crate) _opaque: [u8; 0],
}

#[repr(C)]
pub(crate) struct TF_FileStatistics {
    pub(crate) length: i64,
    pub(crate) mtime_nsec: i64,
    pub(crate) is_directory: bool,
}

#[repr(C)]
pub(crate) struct TF_RandomAccessFile {
    pub(crate) plugin_file: *mut c_void,
}

#[repr(C)]
pub(crate) struct TF_WritableFile {
    pub(crate) plugin_file: *mut c_void,
}

#[repr(C)]
pub(crate) struct TF_Filesystem {
    pub(crate) plugin_filesystem: *mut c_void,
}

pub(crate) type Unused = Option<unsafe extern "C" fn()>;

#[repr(C)]
pub(crate) struct TF_RandomAccessFileOps {
    pub(crate) cleanup: Option<unsafe extern "C" fn(*mut TF_RandomAccessFile)>,
    pub(crate) read: Option<unsafe extern "C" fn(*const TF_RandomAccessFile, u64, usize, *mut c_char, *mut TF_Status) -> i64>,
}

#[repr(C)]
pub(crate) struct TF_WritableFileOps {
    pub(crate) cleanup: Option<unsafe extern "C" fn(*mut TF_WritableFile)>,
    pub(crate) append: Option<unsafe extern "C" fn(*const TF_WritableFile, *const c_char, usize, *mut TF_Status)>,
    pub(crate) tell: Option<unsafe extern "C" fn(*const TF_WritableFile, *mut TF_Status) -> i64>,
    pub(crate) flush: Option<unsafe extern "C" fn(*const TF_WritableFile, *mut TF_Status)>,
    pub(crate) sync: Option<unsafe extern "C" fn(*const TF_WritableFile, *mut TF_Status)>,
    pub(crate) close: Option<unsafe extern "C" fn(*const TF_WritableFile, *mut TF_Status)>,
}

#[repr(C)]
pub(crate) struct TF_ReadOnlyMemoryRegionOps {
    pub(crate) cleanup: Unused,
    pub(crate) data: Unused,
    pub(crate) length: Unused,
}

pub(crate) type PathOp = Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_Status)>;

#[repr(C)]
pub(crate) struct TF_FilesystemOps {
    pub(crate) init: Option<unsafe extern "C" fn(*mut TF_Filesystem, *mut TF_Status)>,
    pub(crate) cleanup: Option<unsafe extern "C" fn(*mut TF_Filesystem)>,
    pub(crate) new_random_access_file:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_RandomAccessFile, *mut TF_Status)>,
    pub(crate) new_writable_file:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_WritableFile, *mut TF_Status)>,
    pub(crate) new_appendable_file:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_WritableFile, *mut TF_Status)>,
    pub(crate) new_read_only_memory_region_from_file: Unused,
    pub(crate) create_dir: PathOp,
    pub(crate) recursively_create_dir: PathOp,
    pub(crate) delete_file: PathOp,
    pub(crate) delete_dir: PathOp,
    pub(crate) delete_recursively:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut u64, *mut u64, *mut TF_Status)>,
    pub(crate) rename_file: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *const c_char, *mut TF_Status)>,
    pub(crate) copy_file: Unused,
    pub(crate) path_exists: PathOp,
    pub(crate) paths_exist: Unused,
    pub(crate) stat: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_FileStatistics, *mut TF_Status)>,
    pub(crate) is_directory: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_Status) -> bool>,
    pub(crate) get_file_size: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut TF_Status) -> i64>,
    pub(crate) translate_name: Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char) -> *mut c_char>,
    pub(crate) get_children:
        Option<unsafe extern "C" fn(*const TF_Filesystem, *const c_char, *mut *mut *mut c_char, *mut TF_Status) -> c_int>,
    pub(crate) get_matching_paths: Unused,
    pub(crate) flush_caches: Unused,
    pub(crate) start_transaction: Unused,
    pub(crate) end_transaction: Unused,
    pub(crate) add_to_transaction: Unused,
    pub(crate) get_transaction_for_path: Unused,
    pub(crate) get_or_start_transaction_for_path: Unused,
    pub(crate) decode_transaction_token: Unused,
    pub(crate) get_filesystem_configuration: Unused,
    pub(crate) set_filesystem_configuration: Unused,
    pub(crate) get_filesystem_configuration_option: Unused,
    pub(crate) set_filesystem_configuration_option: Unused,
    pub(crate) get_filesystem_configuration_keys: Unused,
}

#[repr(C)]
pub struct TF_FilesystemPluginOps {
    pub(crate) scheme: *mut c_char,
    pub(crate) filesystem_ops_abi: c_int,
    pub(crate) filesystem_ops_api: c_int,
    pub(crate) filesystem_ops_size: usize,
    pub(crate) filesystem_ops: *mut TF_FilesystemOps,
    pub(crate) random_access_file_ops_abi: c_int,
    pub(crate) random_access_file_ops_api: c_int,
    pub(crate) random_access_file_ops_size: usize,
    pub(crate) random_access_file_ops: *mut TF_RandomAccessFileOps,
    pub(crate) writable_file_ops_abi: c_int,
    pub(crate) writable_file_ops_api: c_int,
    pub(crate) writable_file_ops_size: usize,
    pub(crate) writable_file_ops: *mut TF_WritableFileOps,
    pub(crate) read_only_memory_region_ops_abi: c_int,
    pub(crate) read_only_memory_region_ops_api: c_int,
    pub(crate) read_only_memory_region_ops_size: usize,
    pub(crate) read_only_memory_region_ops: *mut TF_ReadOnlyMemoryRegionOps,
}

#[repr(C)]
pub struct TF_FilesystemPluginInfo {
    pub(crate) num_schemes: usize,
    pub(crate) ops: *mut TF_FilesystemPluginOps,
    pub(crate) plugin_memory_allocate: Option<unsafe extern "C" fn(usize) -> *mut c_void>,
    pub(crate) plugin_memory_free: Option<unsafe extern "C" fn(*mut c_void)>,
}

extern "C" {
    pub(crate) fn TF_SetStatus(status: *mut TF_Status, code: c_int, msg: *const c_char);
}

// TF_Code values (tf_status.h)
pub(crate) const OK: c_int = 0;
pub(crate) const UNKNOWN: c_int = 2;
pub(crate) const INVALID_ARGUMENT: c_int = 3;
pub(crate) const NOT_FOUND: c_int = 5;
pub(crate) const ALREADY_EXISTS: c_int = 6;
pub(crate) const PERMISSION_DENIED: c_int = 7;
pub(crate) const FAILED_PRECONDITION: c_int = 9;
pub(crate) const OUT_OF_RANGE: c_int = 11;
pub(crate) const UNIMPLEMENTED: c_int = 12;
pub(crate) const INTERNAL: c_int = 13;
pub(crate) const UNAVAILABLE: c_int = 14;
pub(crate) const UNAUTHENTICATED: c_int = 16;

/// Bytes an open file for writing holds before they go to HDFS.
pub(crate) const WRITE_PIECE: usize = 4 << 20;

pub(crate) struct Error {
    pub(crate) code: c_int,
    pub(crate) msg: String,
}

pub(crate) type Res<T> = Result<T, Error>;

pub(crate) fn err(code: c_int, msg: impl Into<String>) -> Error {
    Error { code, msg: msg.into() }
}

pub(crate) unsafe fn set_status(status: *mut TF_Status, result: Res<()>) {
    match result {
        Ok(()) => TF_SetStatus(status, OK, c"".as_ptr()),
        Err(e) => {
            let msg = CString::new(e.msg.replace('\0', " ")).unwrap_or_default();
            TF_SetStatus(status, e.code, msg.as_ptr());
        }
    }
}

/// Runs `f` with TF's status set from its result; a panic becomes INTERNAL and never unwinds into TF.
pub(crate) unsafe fn guarded<T: Default>(status: *mut TF_Status, f: impl FnOnce() -> Res<T>) -> T {
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

pub(crate) unsafe fn c_str<'a>(p: *const c_char) -> Res<&'a str> {
    if p.is_null() {
        return Err(err(INVALID_ARGUMENT, "null path"));
    }
    CStr::from_ptr(p).to_str().map_err(|_| err(INVALID_ARGUMENT, "path is not UTF-8"))
}
