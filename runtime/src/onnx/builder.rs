//! A small ONNX graph builder over the generated protobuf types: nodes with fresh
//! value names, deduplicated constants, float initializers and typed graph inputs
//! and outputs, and the layers' graph ops ([`GraphEmitter`], which the layers in
//! `gpu_ops::model` emit through). Every method returns the name of the value it
//! made, so a layer reads as a sequence of ops.

use std::collections::HashMap;

use gpu_ops::model::{GraphEmitter, Reduce, Reduction, Unary};

use super::proto::{
    attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto, type_proto,
    AttributeProto, GraphProto, NodeProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};

/// One dimension of a graph input or output: a fixed size or a named symbol
/// (`"num_edges_0"`), which runtimes treat as "any size".
#[derive(Clone, Debug)]
pub(crate) enum Dim {
    Fixed(i64),
    Named(String),
}

/// An attribute value.
pub(crate) enum Attr {
    Int(i64),
    Float(f32),
    Str(&'static str),
    /// A one-element `float` tensor (`ConstantOfShape`'s `value`).
    FloatTensor(f32),
}

/// Builds one [`GraphProto`].
#[derive(Default)]
pub(crate) struct GraphBuilder {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    /// `int64` constants already made, by value.
    i64_consts: HashMap<Vec<i64>, String>,
    /// `float` scalar constants already made, by bit pattern.
    f32_consts: HashMap<u32, String>,
    next: usize,
}

fn attribute(name: &str, value: Attr) -> AttributeProto {
    let mut a = AttributeProto {
        name: Some(name.into()),
        ..Default::default()
    };
    match value {
        Attr::Int(i) => {
            a.r#type = Some(AttributeType::Int as i32);
            a.i = Some(i);
        }
        Attr::Float(f) => {
            a.r#type = Some(AttributeType::Float as i32);
            a.f = Some(f);
        }
        Attr::Str(s) => {
            a.r#type = Some(AttributeType::String as i32);
            a.s = Some(s.as_bytes().to_vec());
        }
        Attr::FloatTensor(v) => {
            a.r#type = Some(AttributeType::Tensor as i32);
            a.t = Some(f32_tensor("value", &[1], &[v]));
        }
    }
    a
}

/// A `float` tensor with `values` (little-endian `raw_data`).
fn f32_tensor(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Float as i32),
        raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

/// An `int64` tensor with `values`.
fn i64_tensor(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Int64 as i32),
        raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

fn value_info(name: &str, elem: DataType, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| tensor_shape_proto::Dimension {
            value: Some(match d {
                Dim::Fixed(v) => tensor_shape_proto::dimension::Value::DimValue(*v),
                Dim::Named(s) => tensor_shape_proto::dimension::Value::DimParam(s.clone()),
            }),
            denotation: None,
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem as i32),
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

impl GraphBuilder {
    /// A new value name `"{hint}_{n}"`, unique in the graph.
    fn fresh(&mut self, hint: &str) -> String {
        self.next += 1;
        format!("{hint}_{}", self.next)
    }

    /// Adds a node with one output (named after `hint`) and returns that name.
    pub(crate) fn op(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        attrs: Vec<(&str, Attr)>,
        hint: &str,
    ) -> String {
        let out = self.fresh(hint);
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.clone()],
            name: Some(format!("{op_type}_{}", self.nodes.len())),
            op_type: Some(op_type.into()),
            attribute: attrs.into_iter().map(|(n, v)| attribute(n, v)).collect(),
            ..Default::default()
        });
        out
    }

    /// An `int64` constant tensor of shape `[values.len()]` (made once per value).
    pub(crate) fn const_i64(&mut self, values: &[i64]) -> String {
        if let Some(name) = self.i64_consts.get(values) {
            return name.clone();
        }
        let name = self.fresh("const_i64");
        self.initializers
            .push(i64_tensor(&name, &[values.len() as i64], values));
        self.i64_consts.insert(values.to_vec(), name.clone());
        name
    }

    /// An `int64` scalar constant (shape `[]`).
    pub(crate) fn scalar_i64(&mut self, value: i64) -> String {
        let name = self.fresh("scalar_i64");
        self.initializers.push(i64_tensor(&name, &[], &[value]));
        name
    }

    /// A `float` scalar constant (shape `[]`, made once per value).
    pub(crate) fn scalar_f32(&mut self, value: f32) -> String {
        if let Some(name) = self.f32_consts.get(&value.to_bits()) {
            return name.clone();
        }
        let name = self.fresh("const_f32");
        self.initializers.push(f32_tensor(&name, &[], &[value]));
        self.f32_consts.insert(value.to_bits(), name.clone());
        name
    }

    /// A named `float` initializer (a model parameter).
    pub(crate) fn param(&mut self, name: &str, dims: &[i64], values: &[f32]) -> String {
        self.initializers.push(f32_tensor(name, dims, values));
        name.into()
    }

    /// Declares a graph input.
    pub(crate) fn input(&mut self, name: &str, elem: DataType, dims: &[Dim]) -> String {
        self.inputs.push(value_info(name, elem, dims));
        name.into()
    }

    /// Makes `value` a graph output called `name` (through an `Identity`).
    pub(crate) fn output(&mut self, value: &str, name: &str, elem: DataType, dims: &[Dim]) {
        self.nodes.push(NodeProto {
            input: vec![value.into()],
            output: vec![name.into()],
            name: Some(format!("Identity_{}", self.nodes.len())),
            op_type: Some("Identity".into()),
            ..Default::default()
        });
        self.outputs.push(value_info(name, elem, dims));
    }

    /// The finished graph.
    pub(crate) fn finish(self, name: &str, doc: &str) -> GraphProto {
        GraphProto {
            node: self.nodes,
            name: Some(name.into()),
            initializer: self.initializers,
            doc_string: Some(doc.into()),
            input: self.inputs,
            output: self.outputs,
            ..Default::default()
        }
    }
}

/// The layers' graph ops ([`gpu_ops::model::GraphEmitter`]) as ONNX nodes; each
/// value is named after its op (`matmul_12`).
impl GraphEmitter for GraphBuilder {
    fn matmul(&mut self, a: &str, b: &str) -> String {
        self.op("MatMul", &[a, b], vec![], "matmul")
    }

    fn add(&mut self, a: &str, b: &str) -> String {
        self.op("Add", &[a, b], vec![], "add")
    }

    fn sub(&mut self, a: &str, b: &str) -> String {
        self.op("Sub", &[a, b], vec![], "sub")
    }

    fn mul(&mut self, a: &str, b: &str) -> String {
        self.op("Mul", &[a, b], vec![], "mul")
    }

    fn div(&mut self, a: &str, b: &str) -> String {
        self.op("Div", &[a, b], vec![], "div")
    }

    fn gather_rows(&mut self, data: &str, idx: &str) -> String {
        self.op(
            "Gather",
            &[data, idx],
            vec![("axis", Attr::Int(0))],
            "gather",
        )
    }

    fn scatter_rows(
        &mut self,
        data: &str,
        idx: &str,
        updates: &str,
        reduction: Reduction,
    ) -> String {
        let reduction = match reduction {
            Reduction::Add => "add",
            Reduction::Max => "max",
        };
        self.op(
            "ScatterND",
            &[data, idx, updates],
            vec![("reduction", Attr::Str(reduction))],
            "scatter",
        )
    }

    fn unsqueeze(&mut self, x: &str, axis: i64) -> String {
        let axes = self.const_i64(&[axis]);
        self.op("Unsqueeze", &[x, &axes], vec![], "unsqueeze")
    }

    fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let s = self.const_i64(shape);
        self.op("Reshape", &[x, &s], vec![], "reshape")
    }

    fn rows_of(&mut self, x: &str) -> String {
        self.op(
            "Shape",
            &[x],
            vec![("start", Attr::Int(0)), ("end", Attr::Int(1))],
            "rows",
        )
    }

    fn shape_of(&mut self, x: &str) -> String {
        // Named for its use: the edge count of an edge list.
        self.op("Shape", &[x], vec![], "num_edges")
    }

    fn filled(&mut self, rows: &str, tail: &[i64], value: f32) -> String {
        let shape = if tail.is_empty() {
            rows.to_string()
        } else {
            let t = self.const_i64(tail);
            self.op("Concat", &[rows, &t], vec![("axis", Attr::Int(0))], "shape")
        };
        self.op(
            "ConstantOfShape",
            &[&shape],
            vec![("value", Attr::FloatTensor(value))],
            "filled",
        )
    }

    fn first_rows(&mut self, x: &str, n: &str) -> String {
        let zero = self.const_i64(&[0]);
        let axes = self.const_i64(&[0]);
        self.op("Slice", &[x, &zero, n, &axes], vec![], "slice")
    }

    fn arange(&mut self, n: &str) -> String {
        let scalar = self.reshape(n, &[]);
        let (start, delta) = (self.scalar_i64(0), self.scalar_i64(1));
        self.op("Range", &[&start, &scalar, &delta], vec![], "range")
    }

    fn concat0(&mut self, a: &str, b: &str) -> String {
        self.op("Concat", &[a, b], vec![("axis", Attr::Int(0))], "concat")
    }

    fn unary(&mut self, op: Unary, x: &str) -> String {
        let (op_type, hint) = match op {
            Unary::Relu => ("Relu", "relu"),
            Unary::Sqrt => ("Sqrt", "sqrt"),
            Unary::Reciprocal => ("Reciprocal", "reciprocal"),
            Unary::Exp => ("Exp", "exp"),
        };
        self.op(op_type, &[x], vec![], hint)
    }

    fn elu(&mut self, x: &str, alpha: f32) -> String {
        self.op("Elu", &[x], vec![("alpha", Attr::Float(alpha))], "elu")
    }

    fn leaky_relu(&mut self, x: &str, alpha: f32) -> String {
        self.op(
            "LeakyRelu",
            &[x],
            vec![("alpha", Attr::Float(alpha))],
            "leaky_relu",
        )
    }

    fn max_scalar(&mut self, x: &str, value: f32) -> String {
        let c = self.scalar_f32(value);
        self.op("Max", &[x, &c], vec![], "max")
    }

    fn reduce(&mut self, op: Reduce, x: &str, axis: i64) -> String {
        let op_type = match op {
            Reduce::Sum => "ReduceSum",
            Reduce::Mean => "ReduceMean",
        };
        let axes = self.const_i64(&[axis]);
        self.op(
            op_type,
            &[x, &axes],
            vec![("keepdims", Attr::Int(0))],
            "reduce",
        )
    }
}
