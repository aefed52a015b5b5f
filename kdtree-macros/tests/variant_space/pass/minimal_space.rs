// No `check` (every point is valid), a private struct, an enum axis named by path, trailing commas.
use kdtree_jit::{Arch, AxisValue, Target, Variant};

mod kinds {
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
    pub enum Op {
        Add,
    }

    impl kdtree_jit::AxisValue for Op {
        fn as_str(&self) -> &'static str {
            "add"
        }
    }
}

kdtree_jit::variant_space! {
    space MyOps {
        name = "op_{ op }_{width}";
        template = "ops.cu.tera";
        axes { op: kinds::Op = [Add], width: u8 = [1, 2,], }
    }
}

fn main() {
    assert_eq!(MyOps::SPACE, "my_ops");
    assert_eq!(kinds::Op::Add.as_str(), "add");
    let names: Vec<String> = MyOps::all().iter().map(Variant::name).collect();
    assert_eq!(names, ["op_add_1", "op_add_2"]);
    assert_eq!(MyOps::valid(&Target { arch: Arch(90) }).len(), 2);
}
