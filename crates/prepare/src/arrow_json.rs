//! Arrow cells as JSON values: the nested list / struct / string columns that hold chat
//! messages (`datasets` writes `messages` as `list<struct<content: string, role: string>>`).
//! A type with no JSON reading here (binary, temporal, ...) becomes `null`, which the
//! conversation parser reports as a malformed message.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, OffsetSizeTrait};
use arrow_schema::DataType;
use serde_json::{Map, Number, Value};

/// The value of row `r` of `a`.
pub fn cell(a: &dyn Array, r: usize) -> Value {
    if a.is_null(r) {
        return Value::Null;
    }
    macro_rules! int {
        ($t:ty) => {
            Value::from(a.as_primitive::<$t>().value(r))
        };
    }
    match a.data_type() {
        DataType::Boolean => Value::Bool(a.as_boolean().value(r)),
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float32 => float(a.as_primitive::<Float32Type>().value(r) as f64),
        DataType::Float64 => float(a.as_primitive::<Float64Type>().value(r)),
        DataType::Utf8 => Value::String(a.as_string::<i32>().value(r).to_string()),
        DataType::LargeUtf8 => Value::String(a.as_string::<i64>().value(r).to_string()),
        DataType::Utf8View => Value::String(a.as_string_view().value(r).to_string()),
        DataType::List(_) => list::<i32>(a, r),
        DataType::LargeList(_) => list::<i64>(a, r),
        DataType::FixedSizeList(_, _) => {
            let l = a.as_fixed_size_list().value(r);
            Value::Array((0..l.len()).map(|i| cell(&l, i)).collect())
        }
        DataType::Struct(fields) => {
            let s = a.as_struct();
            let mut obj = Map::new();
            for (f, col) in fields.iter().zip(s.columns()) {
                obj.insert(f.name().clone(), cell(col.as_ref(), r));
            }
            Value::Object(obj)
        }
        DataType::Dictionary(_, _) => {
            let d = a.as_any_dictionary();
            let key = d.normalized_keys()[r];
            cell(d.values().as_ref(), key)
        }
        _ => Value::Null,
    }
}

fn list<O: OffsetSizeTrait>(a: &dyn Array, r: usize) -> Value {
    let l = a.as_list::<O>().value(r);
    Value::Array((0..l.len()).map(|i| cell(&l, i)).collect())
}

fn float(x: f64) -> Value {
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
    use arrow_schema::{Field, Fields};

    use super::*;

    #[test]
    fn a_messages_column_reads_as_json() {
        let fields = Fields::from(vec![
            Field::new("content", DataType::Utf8, true),
            Field::new("role", DataType::Utf8, true),
        ]);
        let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
        for (c, role) in [("hi", "user"), ("yo", "assistant")] {
            let s = b.values();
            s.field_builder::<StringBuilder>(0).unwrap().append_value(c);
            s.field_builder::<StringBuilder>(1)
                .unwrap()
                .append_value(role);
            s.append(true);
        }
        b.append(true);
        b.append_null();
        let a = Arc::new(b.finish());
        assert_eq!(
            cell(a.as_ref(), 0),
            serde_json::json!([{"content": "hi", "role": "user"}, {"content": "yo", "role": "assistant"}])
        );
        assert_eq!(cell(a.as_ref(), 1), Value::Null);
    }

    /// Parquet and Arrow rows carry a `reasoning_content` struct field (null where a message
    /// has none) to the conversation as the JSONL reader does.
    #[test]
    fn a_reasoning_content_field_reaches_the_conversation() {
        let fields = Fields::from(vec![
            Field::new("content", DataType::Utf8, true),
            Field::new("reasoning_content", DataType::Utf8, true),
            Field::new("role", DataType::Utf8, true),
        ]);
        let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
        for (c, r, role) in [("q", None, "user"), ("Yes.", Some("why"), "assistant")] {
            let s = b.values();
            s.field_builder::<StringBuilder>(0).unwrap().append_value(c);
            s.field_builder::<StringBuilder>(1)
                .unwrap()
                .append_option(r);
            s.field_builder::<StringBuilder>(2)
                .unwrap()
                .append_value(role);
            s.append(true);
        }
        b.append(true);
        let a = Arc::new(b.finish());
        let row = serde_json::json!({"messages": cell(a.as_ref(), 0)});
        let m = crate::parse_sample(&row).unwrap();
        assert_eq!(m[0].content, "q");
        assert_eq!(m[1].content, "<think>\nwhy\n</think>\n\nYes.");
    }
}
