//! A little-endian byte cursor whose errors say what was being read and where the file ended.

use anyhow::{bail, Context, Result};

use super::value::Value;

/// GGUF metadata value type ids.
const TYPE_U8: u32 = 0;
const TYPE_I8: u32 = 1;
const TYPE_U16: u32 = 2;
const TYPE_I16: u32 = 3;
const TYPE_U32: u32 = 4;
const TYPE_I32: u32 = 5;
const TYPE_F32: u32 = 6;
const TYPE_BOOL: u32 = 7;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;
const TYPE_U64: u32 = 10;
const TYPE_I64: u32 = 11;
const TYPE_F64: u32 = 12;

/// Arrays of arrays are legal GGUF; deeper nesting than this is refused, not recursed into.
const MAX_ARRAY_DEPTH: u32 = 8;

/// Reads GGUF primitives from a byte slice, front to back.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// The offset of the next byte to read.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// The next `n` bytes; `what` names them in the error if the file ends first.
    pub(crate) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = self.buf.len() - self.pos;
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let bytes = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(bytes)
            }
            _ => bail!(
                "GGUF file is truncated: {what} needs {n} bytes at offset {}, but only {left} remain",
                self.pos
            ),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    /// A little-endian `u32`.
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// A little-endian `u64`.
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: a `u64` byte length, then UTF-8 bytes.
    pub(crate) fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| anyhow::anyhow!("{what} at offset {} is not valid UTF-8", self.pos))
    }

    /// A metadata value of GGUF type id `ty`.
    pub(crate) fn value(&mut self, ty: u32) -> Result<Value> {
        self.value_at_depth(ty, 0)
    }

    fn value_at_depth(&mut self, ty: u32, depth: u32) -> Result<Value> {
        Ok(match ty {
            TYPE_U8 => Value::U8(u8::from_le_bytes(self.array("uint8 value")?)),
            TYPE_I8 => Value::I8(i8::from_le_bytes(self.array("int8 value")?)),
            TYPE_U16 => Value::U16(u16::from_le_bytes(self.array("uint16 value")?)),
            TYPE_I16 => Value::I16(i16::from_le_bytes(self.array("int16 value")?)),
            TYPE_U32 => Value::U32(self.u32("uint32 value")?),
            TYPE_I32 => Value::I32(i32::from_le_bytes(self.array("int32 value")?)),
            TYPE_U64 => Value::U64(self.u64("uint64 value")?),
            TYPE_I64 => Value::I64(i64::from_le_bytes(self.array("int64 value")?)),
            TYPE_F32 => Value::F32(f32::from_le_bytes(self.array("float32 value")?)),
            TYPE_F64 => Value::F64(f64::from_le_bytes(self.array("float64 value")?)),
            TYPE_BOOL => match self.array::<1>("bool value")?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => bail!("bool value at offset {} is {b}, not 0 or 1", self.pos - 1),
            },
            TYPE_STRING => Value::String(self.string("string value")?),
            TYPE_ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    bail!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels");
                }
                let elem_ty = self.u32("array element type")?;
                let count = self.u64("array length")?;
                // Every element takes at least one byte: a count beyond the bytes left is a
                // truncated file, found before allocating or looping.
                let left = (self.buf.len() - self.pos) as u64;
                if count > left {
                    bail!(
                        "GGUF file is truncated: array of {count} elements at offset {}, but only {left} bytes remain",
                        self.pos
                    );
                }
                let mut items = Vec::with_capacity(count as usize);
                for i in 0..count {
                    let item = self
                        .value_at_depth(elem_ty, depth + 1)
                        .with_context(|| format!("array element {i}"))?;
                    items.push(item);
                }
                Value::Array(items)
            }
            other => bail!("unknown metadata value type {other}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_values_and_names_truncation() {
        let mut bytes = Vec::new();
        bytes.extend(TYPE_STRING.to_le_bytes());
        bytes.extend(2u64.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
        bytes.push(b'a');
        bytes.extend(3u64.to_le_bytes());
        bytes.extend(b"bc");
        let mut c = Cursor::new(&bytes);
        let err = c.value(TYPE_ARRAY).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("array element 1"), "{msg}");
        assert!(msg.contains("truncated"), "{msg}");

        let mut c = Cursor::new(&[2, 1]);
        assert!(c
            .value(TYPE_BOOL)
            .is_err_and(|e| e.to_string().contains("not 0 or 1")));
        let mut c = Cursor::new(&[0xff, 0xff]);
        assert_eq!(c.value(TYPE_I16).unwrap(), Value::I16(-1));
        let huge = [TYPE_U8.to_le_bytes().as_slice(), &u64::MAX.to_le_bytes()].concat();
        assert!(Cursor::new(&huge).value(TYPE_ARRAY).is_err());
        assert!(Cursor::new(&[]).value(99).is_err());
    }
}
