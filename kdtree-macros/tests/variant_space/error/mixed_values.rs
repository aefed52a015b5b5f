use kdtree_jit::AxisValue;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Algo {
    Tiles,
}

impl AxisValue for Algo {
    fn as_str(&self) -> &'static str {
        "tiles"
    }
}

kdtree_jit::variant_space! {
    pub space Gemm {
        template = "gemm.cu.tera";
        name = "gemm_{algo}";
        axes { algo: Algo = [Tiles, 3] }
    }
}
fn main() {}
