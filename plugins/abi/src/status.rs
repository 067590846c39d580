//! Status codes: zero is success, anything else comes with the plugin's `last_error`.

/// The header's `DF_ATTN_*` status codes.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    InvalidArgument = 1,
    Unsupported = 2,
    Version = 3,
    Internal = 4,
    Panic = 5,
}

impl Status {
    pub const fn code(self) -> i32 {
        self as i32
    }
}

/// The header's name of status `code` (codes a plugin invents are "unknown status").
pub fn status_name(code: i32) -> &'static str {
    match code {
        0 => "DF_ATTN_OK",
        1 => "DF_ATTN_ERR_INVALID_ARGUMENT",
        2 => "DF_ATTN_ERR_UNSUPPORTED",
        3 => "DF_ATTN_ERR_VERSION",
        4 => "DF_ATTN_ERR_INTERNAL",
        5 => "DF_ATTN_ERR_PANIC",
        _ => "unknown status",
    }
}
