use kdtree_jit::{Arch, AxisValue, Invalid, Target, Variant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Algo {
    Tiles,
    Rows,
}

impl AxisValue for Algo {
    fn as_str(&self) -> &'static str {
        match self {
            Algo::Tiles => "tiles",
            Algo::Rows => "rows",
        }
    }
}

fn rule(v: &Gemm, target: &Target) -> Result<(), Invalid> {
    let requested = v.bm as usize * 1024;
    let max = target.arch.smem_per_block_max();
    match v.algo {
        _ if requested > max => Err(Invalid::SharedMemory { requested, max }),
        Algo::Rows if v.bm > 16 => Err(Invalid::Incompatible { reason: "rows handles bm <= 16".into() }),
        _ => Ok(()),
    }
}

kdtree_jit::variant_space! {
    /// A GEMM space.
    pub space Gemm {
        template = "gemm_{algo}.cu.tera";
        name = "gemm_{algo}_m{bm}_g{group}";
        axes {
            /// How tiles are computed.
            algo: Algo = [Tiles, Rows],
            bm: u32 = [16, 64, 128],
            group: usize = [32, 64],
        }
        check = rule;
    }
}

fn main() {
    assert_eq!(Gemm::SPACE, "gemm");
    let all = Gemm::all();
    assert_eq!(all.len(), 2 * 3 * 2);
    assert_eq!(all[0], Gemm { algo: Algo::Tiles, bm: 16, group: 32 });
    assert_eq!(all[1], Gemm { algo: Algo::Tiles, bm: 16, group: 64 });
    assert_eq!(all[11], Gemm { algo: Algo::Rows, bm: 128, group: 64 });

    let v = Gemm { algo: Algo::Rows, bm: 64, group: 32 };
    assert_eq!(v.name(), "gemm_rows_m64_g32");
    assert_eq!(v.template(), "gemm_rows.cu.tera");
    let context = v.context().into_json();
    assert_eq!(context["algo"], "rows");
    assert_eq!(context["bm"], 64);
    assert_eq!(context["group"], 32);
    assert_eq!(context["name"], "gemm_rows_m64_g32");
    for v in &all {
        assert_eq!(Gemm::from_name(&v.name()).as_ref(), Some(v));
    }
    assert_eq!(Gemm::from_name("gemm_rows_m64_g31"), None);

    let sm120 = Target { arch: Arch(120) };
    assert_eq!(
        Gemm { algo: Algo::Tiles, bm: 128, group: 32 }.check(&sm120),
        Err(Invalid::SharedMemory { requested: 131072, max: 101376 })
    );
    assert_eq!(v.check(&sm120).unwrap_err().to_string(), "rows handles bm <= 16");
    let valid = Gemm::valid(&sm120);
    assert_eq!(valid.len(), 2 * 2 + 2);
    assert!(valid.iter().all(|v| v.check(&sm120).is_ok()));

    let json = serde_json::to_string(&v).unwrap();
    assert_eq!(json, r#"{"algo":"Rows","bm":64,"group":32}"#);
    assert_eq!(serde_json::from_str::<Gemm>(&json).unwrap(), v);
}
