//! The device-path boundary on the CPU (no GPU needed): every bad tensor or page table is a typed
//! [`ViewError`] carrying the values, returned by host-only checks before anything touches a GPU.
//! The views use made-up device addresses: validation never dereferences them, which is the point.

use ferrattn::device_api::{
    validate, validate_lengths, DecodePlan, DecodeShape, DecodeViews, KvCache, LeanSchedule,
    Location, TensorView, ViewError,
};
use ferrattn::{DType, DeviceCaps, FerrattnError};

const B: usize = 2;
const HQ: usize = 8;
const HK: usize = 2;
const D: usize = 128;
const PAGE: usize = 16;
const POOL: usize = 40;
const MAX_PAGES: usize = 8;

fn shape() -> DecodeShape {
    DecodeShape {
        batch: B,
        query_len: 1,
        heads_q: HQ,
        heads_kv: HK,
        head_dim: D,
        dtype: DType::F16,
        causal: false,
        softmax_scale: None,
    }
}

fn table() -> Vec<i32> {
    // sequence 0 on pages 0..8, sequence 1 on pages 39, 38, ... (any order)
    let mut t: Vec<i32> = (0..MAX_PAGES as i32).collect();
    t.extend((0..MAX_PAGES as i32).map(|i| POOL as i32 - 1 - i));
    t
}

fn paged<'t>(t: &'t [i32]) -> KvCache<'t> {
    KvCache::Paged {
        page_size: PAGE,
        num_pages: POOL,
        max_pages: MAX_PAGES,
        page_table: t,
    }
}

fn plan(kv: KvCache<'_>) -> DecodePlan {
    DecodePlan::new(
        &shape(),
        &DeviceCaps::hopper_reference(),
        &[100, 128],
        kv,
        1,
        LeanSchedule::StreamK,
    )
    .expect("a valid plan")
}

/// A device view at a made-up address: `bytes` of memory on device `ordinal`, any strides.
fn raw<'a>(
    addr: u64,
    bytes: usize,
    ordinal: usize,
    dtype: DType,
    shape: &[usize],
    strides: &[usize],
) -> TensorView<'a> {
    // SAFETY: never dereferenced; only validated.
    unsafe { TensorView::cuda(addr, bytes, ordinal, dtype, shape, strides) }.unwrap()
}

/// A contiguous device view at a made-up, 256-aligned address on device 0.
fn dev<'a>(addr: u64, dtype: DType, shape: &[usize]) -> TensorView<'a> {
    let strides = ferrattn::device_api::contiguous_strides(shape);
    raw(
        addr,
        shape.iter().product::<usize>() * dtype.size_bytes(),
        0,
        dtype,
        shape,
        &strides,
    )
}

struct Set<'a> {
    q: TensorView<'a>,
    k: TensorView<'a>,
    v: TensorView<'a>,
    o: TensorView<'a>,
    lse: TensorView<'a>,
}

impl<'a> Set<'a> {
    fn paged() -> Set<'a> {
        Set {
            q: dev(0x1000_0000, DType::F16, &[B, 1, HQ, D]),
            k: dev(0x2000_0000, DType::F16, &[POOL, PAGE, HK, D]),
            v: dev(0x3000_0000, DType::F16, &[POOL, PAGE, HK, D]),
            o: dev(0x4000_0000, DType::F16, &[B, 1, HQ, D]),
            lse: dev(0x5000_0000, DType::F32, &[B, HQ, 1]),
        }
    }
    fn check(&self, plan: &DecodePlan) -> Result<(), ViewError> {
        let x = DecodeViews {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            o: &self.o,
            lse: &self.lse,
        };
        validate(plan, &x, Location::Cuda(0))
    }
}

#[test]
fn good_views_pass() {
    let t = table();
    let p = plan(paged(&t));
    Set::paged().check(&p).unwrap();
    let c = plan(KvCache::Contiguous { max_seqlen_k: 128 });
    let mut s = Set::paged();
    s.k = dev(0x2000_0000, DType::F16, &[B, 128, HK, D]);
    s.v = dev(0x3000_0000, DType::F16, &[B, 128, HK, D]);
    s.check(&c).unwrap();
    assert!(p.workspace_bytes() > 0 && p.workspace_bytes().is_multiple_of(256));
    assert!(p.to_json().contains("\"page_size\": 16"));
    // the bound serves this step and any other stream-K step of the shape
    let bound =
        DecodePlan::stream_k_workspace_bound(&shape(), &DeviceCaps::hopper_reference(), MAX_PAGES)
            .unwrap();
    assert!(
        bound >= p.workspace_bytes(),
        "{bound} < {}",
        p.workspace_bytes()
    );
    // a step with other lengths but the same grid may reuse a graph captured from this one
    let other = DecodePlan::new(
        &shape(),
        &DeviceCaps::hopper_reference(),
        &[120, 90],
        paged(&t),
        1,
        LeanSchedule::StreamK,
    )
    .unwrap();
    assert_eq!(
        p.same_launch(&other),
        p.step().num_ctas() == other.step().num_ctas()
    );
    assert!(p.same_launch(&p.clone()));
    assert!(!p.same_launch(&c));
}

#[test]
fn short_buffer_is_rejected_with_the_byte_counts() {
    let t = table();
    let p = plan(paged(&t));
    let mut s = Set::paged();
    let need = B * HQ * D * 2;
    s.q = raw(
        0x1000_0000,
        need - 2,
        0,
        DType::F16,
        &[B, 1, HQ, D],
        &[HQ * D, HQ * D, D, 1],
    );
    match s.check(&p) {
        Err(ViewError::ShortBuffer {
            tensor: "q",
            needed,
            declared,
            ..
        }) => assert_eq!((needed, declared), (need, need - 2)),
        other => panic!("expected ShortBuffer, got {other:?}"),
    }
}

#[test]
fn wrong_stride_is_rejected_with_the_strides() {
    let t = table();
    let p = plan(paged(&t));
    let mut s = Set::paged();
    // a transposed view (heads and pages swapped in memory) of a large enough buffer
    let strides = [PAGE * HK * D, HK * D, 1, HK];
    s.k = raw(
        0x2000_0000,
        POOL * PAGE * HK * D * 2,
        0,
        DType::F16,
        &[POOL, PAGE, HK, D],
        &strides,
    );
    match s.check(&p) {
        Err(ViewError::NotContiguous {
            tensor: "k",
            got,
            expected,
            ..
        }) => {
            assert_eq!(got, strides);
            assert_eq!(expected, vec![PAGE * HK * D, HK * D, D, 1]);
        }
        other => panic!("expected NotContiguous, got {other:?}"),
    }
}

#[test]
fn wrong_device_is_rejected_with_both_devices() {
    let t = table();
    let p = plan(paged(&t));
    let mut s = Set::paged();
    s.v = raw(
        0x3000_0000,
        POOL * PAGE * HK * D * 2,
        1,
        DType::F16,
        &[POOL, PAGE, HK, D],
        &[PAGE * HK * D, HK * D, D, 1],
    );
    assert_eq!(
        s.check(&p),
        Err(ViewError::Device {
            tensor: "v",
            got: Location::Cuda(1),
            expected: Location::Cuda(0)
        })
    );
    // host memory where device memory is needed
    let host = vec![half::f16::ZERO; B * HQ * D];
    let mut s = Set::paged();
    s.o = TensorView::host(&host, &[B, 1, HQ, D]).unwrap();
    assert!(matches!(
        s.check(&p),
        Err(ViewError::Device {
            tensor: "o",
            got: Location::Cpu,
            ..
        })
    ));
}

#[test]
fn misaligned_pointer_is_rejected_with_the_address() {
    let t = table();
    let p = plan(paged(&t));
    let mut s = Set::paged();
    s.o = dev(0x4000_0008, DType::F16, &[B, 1, HQ, D]);
    assert_eq!(
        s.check(&p),
        Err(ViewError::Misaligned {
            tensor: "o",
            addr: 0x4000_0008,
            align: 16
        })
    );
}

#[test]
fn wrong_dtype_is_rejected_with_both_dtypes() {
    let t = table();
    let p = plan(paged(&t));
    let mut s = Set::paged();
    s.q = dev(0x1000_0000, DType::BF16, &[B, 1, HQ, D]);
    assert_eq!(
        s.check(&p),
        Err(ViewError::DType {
            tensor: "q",
            got: DType::BF16,
            expected: DType::F16
        })
    );
    s = Set::paged();
    s.lse = dev(0x5000_0000, DType::F16, &[B, HQ, 1]);
    assert!(matches!(
        s.check(&p),
        Err(ViewError::DType {
            tensor: "lse",
            got: DType::F16,
            expected: DType::F32
        })
    ));
}

#[test]
fn shape_and_rank_disagreements_name_both_shapes() {
    let t = table();
    let p = plan(paged(&t));
    let mut s = Set::paged();
    s.k = dev(0x2000_0000, DType::F16, &[POOL, PAGE, 4, D]);
    assert_eq!(
        s.check(&p),
        Err(ViewError::Shape {
            tensor: "k",
            got: vec![POOL, PAGE, 4, D],
            expected: vec![POOL, PAGE, HK, D],
            layout: "[num_pages, page_size, heads_kv, head_dim]"
        })
    );
    s = Set::paged();
    s.lse = dev(0x5000_0000, DType::F32, &[B, HQ]);
    assert!(matches!(
        s.check(&p),
        Err(ViewError::Rank {
            tensor: "lse",
            got: 2,
            expected: 3,
            ..
        })
    ));
    // SAFETY: never dereferenced.
    let r = unsafe { TensorView::cuda(0, 8, 0, DType::F16, &[2, 2], &[2]) };
    assert!(matches!(r, Err(ViewError::StridesRank { .. })));
}

#[test]
fn page_index_out_of_the_pool_is_rejected_at_plan_time() {
    let mut t = table();
    t[MAX_PAGES + 3] = POOL as i32; // sequence 1, slot 3: one past the pool
    let err = DecodePlan::new(
        &shape(),
        &DeviceCaps::hopper_reference(),
        &[100, 128],
        paged(&t),
        1,
        LeanSchedule::StreamK,
    )
    .unwrap_err();
    match err {
        FerrattnError::View(ViewError::PageOutOfPool {
            sequence,
            slot,
            page,
            num_pages,
        }) => assert_eq!((sequence, slot, page, num_pages), (1, 3, POOL as i32, POOL)),
        other => panic!("expected PageOutOfPool, got {other:?}"),
    }
    t[MAX_PAGES + 3] = -1;
    assert!(matches!(
        validate_lengths(&shape(), &[100, 128], &paged(&t)),
        Err(ViewError::PageOutOfPool { page: -1, .. })
    ));
    // entries past a sequence's last page are never read, so they may hold anything
    let mut t = table();
    t[7] = -1; // sequence 0 uses ceil(100 / 16) = 7 pages: slot 7 is unused
    validate_lengths(&shape(), &[100, 128], &paged(&t)).unwrap();
}

#[test]
fn sequence_longer_than_its_pages_is_rejected() {
    let t = table();
    assert_eq!(
        validate_lengths(&shape(), &[100, 129], &paged(&t)),
        Err(ViewError::SequenceLongerThanPages {
            sequence: 1,
            len: 129,
            max_pages: MAX_PAGES,
            page_size: PAGE
        })
    );
    assert!(matches!(
        validate_lengths(&shape(), &[100], &paged(&t)),
        Err(ViewError::Length { got: 1, .. })
    ));
    assert!(matches!(
        validate_lengths(&shape(), &[100, 128], &paged(&t[1..])),
        Err(ViewError::PageTableLength { got: 15, .. })
    ));
    let odd = KvCache::Paged {
        page_size: 32,
        num_pages: POOL,
        max_pages: MAX_PAGES,
        page_table: &t,
    };
    assert!(matches!(
        validate_lengths(&shape(), &[100, 128], &odd),
        Err(ViewError::PageSize { got: 32, .. })
    ));
    // a pool whose token rows the paged kernels cannot address in 32 bits
    let huge = KvCache::Paged {
        page_size: PAGE,
        num_pages: (u32::MAX as usize) / PAGE + 1,
        max_pages: MAX_PAGES,
        page_table: &t,
    };
    let rows = ((u32::MAX as usize) / PAGE + 1) * PAGE;
    assert!(matches!(
        validate_lengths(&shape(), &[100, 128], &huge),
        Err(ViewError::Length { got, .. }) if got == rows
    ));
    assert!(matches!(
        validate_lengths(
            &shape(),
            &[100, 200],
            &KvCache::Contiguous { max_seqlen_k: 128 },
        ),
        Err(ViewError::Length { got: 200, .. })
    ));
}

#[test]
fn a_plan_reads_back_from_json_and_a_tampered_one_is_refused() {
    let t = table();
    let p = plan(paged(&t));
    let json = p.to_json();
    assert_eq!(DecodePlan::from_json(&json).unwrap(), p);
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        f(&mut v);
        DecodePlan::from_json(&v.to_string())
    };
    // sequence 1's length raised past its 8 pages of 16 (the padded extent)
    let e = edit(&|v| v["step"]["problem"]["seqlens_k"][1] = 129.into()).unwrap_err();
    assert!(e.to_string().contains("129"), "{e}");
    // a page outside the pool of 40
    let e = edit(&|v| v["step"]["kv"]["table"][0] = 40.into()).unwrap_err();
    assert!(e.to_string().contains("outside the pool"), "{e}");
    // a shape that is not the step's
    let e = edit(&|v| v["shape"]["heads_q"] = 16.into()).unwrap_err();
    assert!(e.to_string().contains("disagrees"), "{e}");
}

#[test]
fn workspace_and_host_views_are_checked() {
    let data = vec![0f32; 12];
    let v = TensorView::host(&data, &[3, 4]).unwrap();
    assert_eq!(v.strides(), &[4, 1]);
    assert_eq!(v.extent_bytes(), 48);
    assert_eq!(v.location(), Location::Cpu);
    assert!(v.is_contiguous());
    let w = TensorView::host_strided(&data, &[4, 3], &[1, 4]).unwrap();
    assert!(!w.is_contiguous());
    assert_eq!(w.extent_bytes(), (3 + 2 * 4 + 1) * 4);
}

/// The TurboAttention cache's boundary on the CPU: the same typed errors, from host-only checks.
mod turbo {
    use super::{dev, raw};
    use ferrattn::device_api::{
        validate_append, validate_decode, validate_prefill, Location, TensorView, TurboCacheSpec,
        TurboDecodePlan, TurboDecodeViews, TurboPrefillPlan, TurboPrefillViews, TurboSchedule,
        TurboShape, ViewError, TURBO_BLOCK_TOKENS,
    };
    use ferrattn::turbo::TurboConfig;
    use ferrattn::{DType, FerrattnError};

    const B: usize = 2;
    const HQ: usize = 8;
    const HK: usize = 2;
    const D: usize = 128;
    const S: usize = 100;

    fn shape() -> TurboShape {
        TurboShape {
            batch: B,
            heads_q: HQ,
            heads_kv: HK,
            head_dim: D,
            dtype: DType::BF16,
            softmax_scale: None,
        }
    }

    fn decode_plan(before: &[usize]) -> TurboDecodePlan {
        TurboDecodePlan::new(
            &TurboConfig::default(),
            &shape(),
            before,
            true,
            TurboSchedule::PerTile,
        )
        .expect("a valid plan")
    }

    fn prefill_plan() -> TurboPrefillPlan {
        TurboPrefillPlan::new(&TurboConfig::default(), &shape(), &[S, 37], S, true)
            .expect("a valid plan")
    }

    #[test]
    fn prefill_workspace_counts_the_query_tiles() {
        // the fast prefill quantises Q into the workspace (one INT8 byte per element, one f32
        // scale per 64-row block and query head): a plan with 4x the query heads needs its
        // codes more (the scales, 32 and 128 bytes here, share one aligned tail)
        let narrow = TurboShape {
            heads_q: HK,
            ..shape()
        };
        let small = TurboPrefillPlan::new(&TurboConfig::default(), &narrow, &[S, 37], S, true)
            .expect("a valid plan")
            .workspace_bytes();
        let blocks = S.div_ceil(64);
        assert_eq!(
            prefill_plan().workspace_bytes() - small,
            (HQ - HK) * B * blocks * 64 * D
        );
    }

    struct Decode<'a> {
        q: TensorView<'a>,
        o: TensorView<'a>,
        lse: TensorView<'a>,
        k_new: TensorView<'a>,
        v_new: TensorView<'a>,
    }

    impl<'a> Decode<'a> {
        fn new() -> Decode<'a> {
            Decode {
                q: dev(0x1000_0000, DType::BF16, &[B, 1, HQ, D]),
                o: dev(0x2000_0000, DType::BF16, &[B, 1, HQ, D]),
                lse: dev(0x3000_0000, DType::F32, &[B, HQ, 1]),
                k_new: dev(0x4000_0000, DType::BF16, &[B, 1, HK, D]),
                v_new: dev(0x5000_0000, DType::BF16, &[B, 1, HK, D]),
            }
        }
        fn check(&self, p: &TurboDecodePlan) -> Result<(), ViewError> {
            validate_append(p, &self.k_new, &self.v_new, Location::Cuda(0))?;
            let x = TurboDecodeViews {
                q: &self.q,
                o: &self.o,
                lse: &self.lse,
            };
            validate_decode(p, &x, Location::Cuda(0))
        }
    }

    fn prefill_views<'a>() -> [TensorView<'a>; 5] {
        [
            dev(0x1000_0000, DType::BF16, &[B, S, HQ, D]),
            dev(0x2000_0000, DType::BF16, &[B, S, HK, D]),
            dev(0x3000_0000, DType::BF16, &[B, S, HK, D]),
            dev(0x4000_0000, DType::BF16, &[B, S, HQ, D]),
            dev(0x5000_0000, DType::F32, &[B, HQ, S]),
        ]
    }

    fn check_prefill(p: &TurboPrefillPlan, t: &[TensorView<'_>; 5]) -> Result<(), ViewError> {
        let x = TurboPrefillViews {
            q: &t[0],
            k: &t[1],
            v: &t[2],
            o: &t[3],
            lse: &t[4],
        };
        validate_prefill(p, &x, Location::Cuda(0))
    }

    #[test]
    fn good_views_and_plans_pass() {
        let p = decode_plan(&[63, 200]);
        Decode::new().check(&p).unwrap();
        assert_eq!(p.seqlens_after(), &[64, 201]);
        // sequence 0's buffer fills at 64 tokens and becomes its block 0
        assert_eq!(p.step().flushes(), &[(0, 0)]);
        assert!(p.workspace_bytes() > 0 && p.workspace_bytes().is_multiple_of(256));
        // a later step with the same grids may replay a graph captured from this one
        let later = decode_plan(&[64, 201]);
        assert!(!p.same_launch(&later), "the flush count differs (1 vs 0)");
        assert!(later.same_launch(&decode_plan(&[65, 202])));
        let pf = prefill_plan();
        check_prefill(&pf, &prefill_views()).unwrap();
        // the INT8 K and V tiles of 2 sequences x 2 heads x 2 blocks of 64 x 128
        assert!(pf.workspace_bytes() >= 2 * (B * HK * 2 * TURBO_BLOCK_TOKENS * D));
        let spec = TurboCacheSpec {
            batch: B,
            heads_kv: HK,
            head_dim: D,
            bits: vec![4, 2],
            capacity_tokens: 1000,
        };
        spec.validate().unwrap();
        assert!(spec.capacity() >= 1000 && spec.capacity() < 1000 + TURBO_BLOCK_TOKENS);
        spec.check_lengths(&[1000, 1]).unwrap();
        // codes: 4 + 2 bits of 15 blocks x 64 x 128 per sequence and tensor, plus parameters
        let codes = 2 * B * 15 * 64 * D * 6 / 8;
        assert!(spec.allocated_bytes() > codes, "{}", spec.allocated_bytes());
    }

    #[test]
    fn short_buffer_is_rejected_with_the_byte_counts() {
        let p = decode_plan(&[10, 20]);
        let mut s = Decode::new();
        let need = B * HQ * D * 2;
        s.o = raw(
            0x2000_0000,
            need - 16,
            0,
            DType::BF16,
            &[B, 1, HQ, D],
            &[HQ * D, HQ * D, D, 1],
        );
        match s.check(&p) {
            Err(ViewError::ShortBuffer {
                tensor: "o",
                needed,
                declared,
                ..
            }) => assert_eq!((needed, declared), (need, need - 16)),
            other => panic!("expected ShortBuffer, got {other:?}"),
        }
    }

    #[test]
    fn wrong_stride_is_rejected_with_the_strides() {
        let p = prefill_plan();
        let mut t = prefill_views();
        // K with heads and tokens swapped in memory ([B, Hk, S, D] read as [B, S, Hk, D])
        let strides = [HK * S * D, D, S * D, 1];
        t[1] = raw(
            0x2000_0000,
            B * S * HK * D * 2,
            0,
            DType::BF16,
            &[B, S, HK, D],
            &strides,
        );
        match check_prefill(&p, &t) {
            Err(ViewError::NotContiguous {
                tensor: "k", got, ..
            }) => assert_eq!(got, strides),
            other => panic!("expected NotContiguous, got {other:?}"),
        }
    }

    #[test]
    fn wrong_device_is_rejected_with_both_devices() {
        let p = decode_plan(&[10, 20]);
        let mut s = Decode::new();
        let strides = ferrattn::device_api::contiguous_strides(&[B, 1, HK, D]);
        s.v_new = raw(
            0x5000_0000,
            B * HK * D * 2,
            1,
            DType::BF16,
            &[B, 1, HK, D],
            &strides,
        );
        assert_eq!(
            s.check(&p),
            Err(ViewError::Device {
                tensor: "v_new",
                got: Location::Cuda(1),
                expected: Location::Cuda(0),
            })
        );
        // host memory where device memory is needed
        let host = vec![half::bf16::ZERO; B * HQ * D];
        let mut s = Decode::new();
        s.q = TensorView::host(&host, &[B, 1, HQ, D]).unwrap();
        assert_eq!(
            s.check(&p),
            Err(ViewError::Device {
                tensor: "q",
                got: Location::Cpu,
                expected: Location::Cuda(0),
            })
        );
    }

    #[test]
    fn misaligned_pointer_is_rejected_with_the_address() {
        let p = prefill_plan();
        let mut t = prefill_views();
        t[4] = dev(0x5000_0004, DType::F32, &[B, HQ, S]);
        assert_eq!(
            check_prefill(&p, &t),
            Err(ViewError::Misaligned {
                tensor: "lse",
                addr: 0x5000_0004,
                align: 16,
            })
        );
    }

    #[test]
    fn wrong_dtype_is_rejected_with_both_dtypes() {
        let p = decode_plan(&[10, 20]);
        let mut s = Decode::new();
        s.k_new = dev(0x4000_0000, DType::F16, &[B, 1, HK, D]);
        assert_eq!(
            s.check(&p),
            Err(ViewError::DType {
                tensor: "k_new",
                got: DType::F16,
                expected: DType::BF16,
            })
        );
        let mut s = Decode::new();
        s.lse = dev(0x3000_0000, DType::BF16, &[B, HQ, 1]);
        assert!(matches!(
            s.check(&p),
            Err(ViewError::DType {
                tensor: "lse",
                got: DType::BF16,
                expected: DType::F32,
            })
        ));
    }

    #[test]
    fn wrong_shape_is_rejected_with_both_shapes() {
        let p = decode_plan(&[10, 20]);
        let mut s = Decode::new();
        // two query tokens: the TurboAttention decode takes one per sequence
        s.q = dev(0x1000_0000, DType::BF16, &[B, 2, HQ, D]);
        match s.check(&p) {
            Err(ViewError::Shape {
                tensor: "q",
                got,
                expected,
                ..
            }) => assert_eq!((got, expected), (vec![B, 2, HQ, D], vec![B, 1, HQ, D])),
            other => panic!("expected Shape, got {other:?}"),
        }
    }

    #[test]
    fn sequence_longer_than_its_capacity_is_rejected() {
        let spec = TurboCacheSpec {
            batch: B,
            heads_kv: HK,
            head_dim: D,
            bits: vec![4, 4],
            capacity_tokens: 128,
        };
        let cap = spec.capacity();
        assert_eq!(
            spec.check_lengths(&[cap, cap + 1]),
            Err(ViewError::SequenceLongerThanCache {
                sequence: 1,
                len: cap + 1,
                capacity: cap,
            })
        );
        // a prompt longer than its padded extent
        let e = TurboPrefillPlan::new(&TurboConfig::default(), &shape(), &[S + 1, 1], S, true)
            .unwrap_err();
        assert!(
            matches!(e, FerrattnError::View(ViewError::Length { got, .. }) if got == S + 1),
            "{e}"
        );
    }

    #[test]
    fn bad_specs_and_shapes_are_rejected_with_the_values() {
        let spec = |bits: Vec<u8>, head_dim: usize| TurboCacheSpec {
            batch: B,
            heads_kv: HK,
            head_dim,
            bits,
            capacity_tokens: 64,
        };
        assert!(matches!(
            spec(vec![4, 3], D).validate(),
            Err(ViewError::Length { got: 3, .. })
        ));
        assert!(matches!(
            spec(vec![4], D).validate(),
            Err(ViewError::Length { got: 1, .. })
        ));
        assert!(matches!(
            spec(vec![4, 4], 96).validate(),
            Err(ViewError::Length { got: 96, .. })
        ));
        let mut s = shape();
        s.heads_q = 7;
        let e = TurboDecodePlan::new(
            &TurboConfig::default(),
            &s,
            &[1, 1],
            true,
            TurboSchedule::PerTile,
        )
        .unwrap_err();
        assert!(
            matches!(e, FerrattnError::View(ViewError::Length { got: 7, .. })),
            "{e}"
        );
        let e = TurboDecodePlan::new(
            &TurboConfig::default(),
            &shape(),
            &[1, 1, 1],
            true,
            TurboSchedule::PerTile,
        )
        .unwrap_err();
        assert!(
            matches!(e, FerrattnError::View(ViewError::Length { got: 3, .. })),
            "{e}"
        );
        // a decode with no append over an empty sequence has nothing to attend to
        let e = TurboDecodePlan::new(
            &TurboConfig::default(),
            &shape(),
            &[0, 5],
            false,
            TurboSchedule::PerTile,
        )
        .unwrap_err();
        assert!(
            matches!(e, FerrattnError::View(ViewError::Length { got: 0, .. })),
            "{e}"
        );
    }
}

/// The TurboQuant cache's boundary on the CPU: specs, plans and views, host-only checks.
mod turboquant {
    use super::{dev, raw};
    use ferrattn::device_api::{
        validate_turboquant_append, validate_turboquant_decode, validate_turboquant_workspace,
        Location, TensorView, TurboQuantCacheSpec, TurboQuantCompression, TurboQuantDecodePlan,
        TurboQuantDecodeViews, TurboQuantSchedule, TurboQuantShape, UnknownTurboQuantCompression,
        ViewError, Workspace, TURBOQUANT_TILE_TOKENS, TURBOQUANT_WORKSPACE_ALIGN,
    };
    use ferrattn::turboquant::TurboQuantConfig;
    use ferrattn::{AttentionProblem, DType, DeviceCaps, FerrattnError};

    const B: usize = 2;
    const HQ: usize = 8;
    const HK: usize = 2;
    const D: usize = 128;

    fn config(d: usize) -> TurboQuantConfig {
        let p = AttentionProblem::uniform(1, 1, 1, 1, 1, d, d, DType::F16);
        TurboQuantConfig::paper_default(&p)
    }

    fn shape() -> TurboQuantShape {
        TurboQuantShape {
            batch: B,
            heads_q: HQ,
            heads_kv: HK,
            head_dim: D,
            softmax_scale: None,
        }
    }

    fn spec(capacity_tokens: usize) -> TurboQuantCacheSpec {
        TurboQuantCacheSpec {
            batch: B,
            heads_kv: HK,
            head_dim: D,
            capacity_tokens,
            config: config(D),
            compression: TurboQuantCompression::default(),
        }
    }

    /// Stream-K over `units` warps of the reference Hopper (132 SMs).
    fn sched(units: usize) -> TurboQuantSchedule {
        TurboQuantSchedule::stream_k(units, &DeviceCaps::hopper_reference()).unwrap()
    }

    fn plan(before: &[usize], append: bool) -> TurboQuantDecodePlan {
        let new = vec![append as usize; before.len()];
        TurboQuantDecodePlan::new(&config(D), &shape(), before, &new, sched(528))
            .expect("a valid plan")
    }

    struct Step<'a> {
        q: TensorView<'a>,
        o: TensorView<'a>,
        lse: TensorView<'a>,
        k_new: TensorView<'a>,
        v_new: TensorView<'a>,
    }

    impl<'a> Step<'a> {
        fn new() -> Step<'a> {
            Step {
                q: dev(0x1000_0000, DType::F16, &[B, 1, HQ, D]),
                o: dev(0x2000_0000, DType::F16, &[B, 1, HQ, D]),
                lse: dev(0x3000_0000, DType::F32, &[B, HQ, 1]),
                k_new: dev(0x4000_0000, DType::F16, &[B, 1, HK, D]),
                v_new: dev(0x5000_0000, DType::F16, &[B, 1, HK, D]),
            }
        }
        fn check(&self, p: &TurboQuantDecodePlan) -> Result<(), ViewError> {
            validate_turboquant_append(p, &self.k_new, &self.v_new, Location::Cuda(0))?;
            let x = TurboQuantDecodeViews {
                q: &self.q,
                o: &self.o,
                lse: &self.lse,
            };
            validate_turboquant_decode(p, &x, Location::Cuda(0))
        }
    }

    #[test]
    fn good_views_specs_and_plans_pass() {
        let p = plan(&[63, 0], true);
        Step::new().check(&p).unwrap();
        assert_eq!(p.lens_after(), &[64, 1]);
        assert_eq!(p.new_rows(), 1);
        // a prefill of ragged prompts: k_new / v_new of the longest
        let pf =
            TurboQuantDecodePlan::new(&config(D), &shape(), &[0, 0], &[37, 130], sched(8)).unwrap();
        assert_eq!((pf.lens_after(), pf.new_rows()), (&[37, 130][..], 130));
        let mut s = Step::new();
        s.k_new = dev(0x4000_0000, DType::F16, &[B, 130, HK, D]);
        s.v_new = dev(0x5000_0000, DType::F16, &[B, 130, HK, D]);
        s.check(&pf).unwrap();
        // and its one-token views are the wrong shape for it
        assert!(matches!(
            Step::new().check(&pf),
            Err(ViewError::Shape {
                tensor: "k_new",
                ..
            })
        ));
        assert!(p.to_json().contains("\"lens_before\""), "{}", p.to_json());
        let s = spec(1000);
        s.validate().unwrap();
        // rounded up to whole 16-token decode iterations
        assert_eq!(s.capacity(), 1008);
        assert_eq!(s.capacity() % TURBOQUANT_TILE_TOKENS, 0);
        s.check_lengths(&[1008, 0]).unwrap();
        // per token and head: d/2 key codes, d/8 signs, 4 norm bytes, d/2 value codes, 2
        let rows = B * HK * 1008;
        assert_eq!(s.allocated_bytes(), rows * (D / 2 + D / 8 + 4 + D / 2 + 2));
        // MSE-only keys and d 64 are on the kernels' list too
        let mut c = config(64);
        c.key_qjl = false;
        TurboQuantCacheSpec {
            head_dim: 64,
            config: c,
            ..spec(16)
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn short_buffer_is_rejected_with_the_byte_counts() {
        let p = plan(&[10, 20], true);
        let mut s = Step::new();
        let need = B * HQ * D * 2;
        s.q = raw(
            0x1000_0000,
            need - 2,
            0,
            DType::F16,
            &[B, 1, HQ, D],
            &[HQ * D, HQ * D, D, 1],
        );
        match s.check(&p) {
            Err(ViewError::ShortBuffer {
                tensor: "q",
                needed,
                declared,
                ..
            }) => assert_eq!((needed, declared), (need, need - 2)),
            other => panic!("expected ShortBuffer, got {other:?}"),
        }
        let mut s = Step::new();
        // SAFETY: never dereferenced.
        s.lse =
            unsafe { TensorView::cuda(0x3000_0000, 4, 0, DType::F32, &[B, HQ, 1], &[HQ, 1, 1]) }
                .unwrap();
        assert!(matches!(
            s.check(&p),
            Err(ViewError::ShortBuffer {
                tensor: "lse",
                declared: 4,
                ..
            })
        ));
    }

    #[test]
    fn wrong_dtype_is_rejected_with_both_dtypes() {
        let p = plan(&[10, 20], true);
        // the TurboQuant kernels are f16 only
        let mut s = Step::new();
        s.q = dev(0x1000_0000, DType::BF16, &[B, 1, HQ, D]);
        assert_eq!(
            s.check(&p),
            Err(ViewError::DType {
                tensor: "q",
                got: DType::BF16,
                expected: DType::F16,
            })
        );
        let mut s = Step::new();
        s.v_new = dev(0x5000_0000, DType::F32, &[B, 1, HK, D]);
        assert_eq!(
            s.check(&p),
            Err(ViewError::DType {
                tensor: "v_new",
                got: DType::F32,
                expected: DType::F16,
            })
        );
        let mut s = Step::new();
        s.lse = dev(0x3000_0000, DType::F16, &[B, HQ, 1]);
        assert!(matches!(
            s.check(&p),
            Err(ViewError::DType { tensor: "lse", .. })
        ));
    }

    #[test]
    fn wrong_device_is_rejected_with_both_devices() {
        let p = plan(&[10, 20], true);
        let mut s = Step::new();
        let strides = ferrattn::device_api::contiguous_strides(&[B, 1, HQ, D]);
        s.o = raw(
            0x2000_0000,
            B * HQ * D * 2,
            1,
            DType::F16,
            &[B, 1, HQ, D],
            &strides,
        );
        assert_eq!(
            s.check(&p),
            Err(ViewError::Device {
                tensor: "o",
                got: Location::Cuda(1),
                expected: Location::Cuda(0),
            })
        );
        let host = vec![half::f16::ZERO; B * HK * D];
        let mut s = Step::new();
        s.k_new = TensorView::host(&host, &[B, 1, HK, D]).unwrap();
        assert_eq!(
            s.check(&p),
            Err(ViewError::Device {
                tensor: "k_new",
                got: Location::Cpu,
                expected: Location::Cuda(0),
            })
        );
    }

    #[test]
    fn misaligned_and_strided_views_are_rejected() {
        let p = plan(&[10, 20], true);
        let mut s = Step::new();
        s.o = dev(0x2000_0008, DType::F16, &[B, 1, HQ, D]);
        assert_eq!(
            s.check(&p),
            Err(ViewError::Misaligned {
                tensor: "o",
                addr: 0x2000_0008,
                align: 16,
            })
        );
        let mut s = Step::new();
        // heads strided by 2 rows: the kernels read dense rows
        let strides = [2 * HQ * D, 2 * HQ * D, 2 * D, 1];
        s.q = raw(
            0x1000_0000,
            2 * B * HQ * D * 2,
            0,
            DType::F16,
            &[B, 1, HQ, D],
            &strides,
        );
        assert!(matches!(
            s.check(&p),
            Err(ViewError::NotContiguous { tensor: "q", .. })
        ));
    }

    #[test]
    fn q_shape_disagreeing_with_the_plan_is_rejected() {
        let p = plan(&[10, 20], true);
        let mut s = Step::new();
        // two query tokens: the decode takes one per sequence
        s.q = dev(0x1000_0000, DType::F16, &[B, 2, HQ, D]);
        match s.check(&p) {
            Err(ViewError::Shape {
                tensor: "q",
                got,
                expected,
                ..
            }) => assert_eq!((got, expected), (vec![B, 2, HQ, D], vec![B, 1, HQ, D])),
            other => panic!("expected Shape, got {other:?}"),
        }
        // query heads other than the plan's
        let mut s = Step::new();
        s.q = dev(0x1000_0000, DType::F16, &[B, 1, 2 * HQ, D]);
        assert!(matches!(
            s.check(&p),
            Err(ViewError::Shape { tensor: "q", .. })
        ));
        // a rank-3 q
        let mut s = Step::new();
        s.q = dev(0x1000_0000, DType::F16, &[B, HQ, D]);
        assert!(matches!(
            s.check(&p),
            Err(ViewError::Rank {
                tensor: "q",
                got: 3,
                expected: 4,
                ..
            })
        ));
    }

    #[test]
    fn lengths_over_capacity_are_rejected() {
        let s = spec(100);
        let cap = s.capacity();
        assert_eq!(cap, 112);
        assert_eq!(
            s.check_lengths(&[cap, cap + 1]),
            Err(ViewError::SequenceLongerThanCache {
                sequence: 1,
                len: cap + 1,
                capacity: cap,
            })
        );
        assert!(matches!(
            s.check_lengths(&[1]),
            Err(ViewError::Length { got: 1, .. })
        ));
    }

    /// The step's workspace at the boundary: too small is [`ViewError::Workspace`] with both
    /// sizes, another device or a misaligned (or null) address typed too; the size is the
    /// plan's, grows with what the step holds, and is in the plan's JSON.
    #[test]
    fn turboquant_workspace_is_checked_with_the_sizes() {
        let p = plan(&[63, 1000], true);
        let need = p.workspace_bytes();
        assert!(need > 0 && need.is_multiple_of(TURBOQUANT_WORKSPACE_ALIGN));
        assert!(p
            .to_json()
            .contains(&format!("\"workspace_bytes\": {need}")));
        let ws = |addr: u64, bytes: usize, ordinal: usize| {
            // SAFETY: never dereferenced; only validated.
            unsafe { Workspace::cuda(addr, bytes, ordinal) }
        };
        validate_turboquant_workspace(&p, &ws(0x7000_0000, need, 0), Location::Cuda(0)).unwrap();
        assert_eq!(
            validate_turboquant_workspace(&p, &ws(0x7000_0000, need - 1, 0), Location::Cuda(0)),
            Err(ViewError::Workspace {
                needed: need,
                declared: need - 1,
            })
        );
        assert_eq!(
            validate_turboquant_workspace(&p, &ws(0x7000_0000, need, 1), Location::Cuda(0)),
            Err(ViewError::Device {
                tensor: "workspace",
                got: Location::Cuda(1),
                expected: Location::Cuda(0),
            })
        );
        for addr in [0x7000_0010u64, 0] {
            assert_eq!(
                validate_turboquant_workspace(&p, &ws(addr, need, 0), Location::Cuda(0)),
                Err(ViewError::Misaligned {
                    tensor: "workspace",
                    addr,
                    align: TURBOQUANT_WORKSPACE_ALIGN as u64,
                })
            );
        }
        // the partials grow with the stream-K width; a decode without an append needs no
        // append tables
        let width = |units: usize| {
            TurboQuantDecodePlan::new(&config(D), &shape(), &[63, 1000], &[1, 1], sched(units))
                .unwrap()
        };
        assert!(width(128).workspace_bytes() > width(16).workspace_bytes());
        assert!(plan(&[64, 1001], false).workspace_bytes() < need);
        // at most one unit per 16-token iteration: HK x (4 + 63) iterations here
        assert_eq!(p.schedule().units(), 528);
        assert_eq!(p.units(), HK * (4 + 63));
    }

    /// The compression path of a cache spec: `Fast` by default, serialised and parsed by its
    /// name (round trip through the spec's JSON), an unknown name refused with the three
    /// names, every path valid for every configuration of the closed list (MSE-only keys, d 64,
    /// 2 bits), each mapped to the backend kernels of its contract.
    #[test]
    fn compression_paths_default_parse_serialise_and_validate() {
        use ferrattn_cuda::turboquant::CompressPath;
        assert_eq!(
            TurboQuantCompression::default(),
            TurboQuantCompression::Fast
        );
        assert_eq!(spec(64).compression, TurboQuantCompression::Fast);
        let paths = [
            (TurboQuantCompression::Exact, "exact", CompressPath::Exact),
            (TurboQuantCompression::Fast, "fast", CompressPath::Fast),
            (TurboQuantCompression::Split, "split", CompressPath::Split),
        ];
        assert_eq!(TurboQuantCompression::ALL.len(), paths.len());
        for (c, name, path) in paths {
            assert_eq!(c.name(), name);
            assert_eq!(c.to_string(), name);
            assert_eq!(name.parse::<TurboQuantCompression>().unwrap(), c);
            assert_eq!(c.path(), path);
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{name}\""));
            let back: TurboQuantCompression = serde_json::from_str(&format!("\"{name}\"")).unwrap();
            assert_eq!(back, c);
            let s = TurboQuantCacheSpec {
                compression: c,
                ..spec(64)
            };
            let json = serde_json::to_string(&s).unwrap();
            assert!(
                json.contains(&format!("\"compression\":\"{name}\"")),
                "{json}"
            );
            s.validate().unwrap();
            for (d, qjl, bits) in [(64, false, 2u8), (128, true, 3), (64, true, 4)] {
                let mut cfg = config(d);
                cfg.key_qjl = qjl;
                cfg.key_bits = bits;
                cfg.value_bits = bits;
                TurboQuantCacheSpec {
                    head_dim: d,
                    config: cfg,
                    ..s.clone()
                }
                .validate()
                .unwrap();
            }
        }
        for bad in ["Fast", "exact ", "fp16", ""] {
            let e = bad.parse::<TurboQuantCompression>().unwrap_err();
            assert_eq!(e, UnknownTurboQuantCompression { got: bad.into() });
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{bad:?}"))
                    && ["\"exact\"", "\"fast\"", "\"split\""]
                        .iter()
                        .all(|n| msg.contains(n)),
                "{msg}"
            );
        }
        assert!(serde_json::from_str::<TurboQuantCompression>("\"Fast\"").is_err());
        // the boundary does not depend on the path: a bad spec is refused on each
        for c in TurboQuantCompression::ALL {
            let e = TurboQuantCacheSpec {
                compression: c,
                ..spec(0)
            }
            .validate()
            .unwrap_err();
            assert!(
                matches!(e, FerrattnError::View(ViewError::Length { got: 0, .. })),
                "{c}: {e}"
            );
        }
    }

    #[test]
    fn bad_specs_plans_and_configs_are_rejected_with_the_values() {
        let view = |r: ferrattn::Result<()>| match r {
            Err(FerrattnError::View(v)) => v,
            other => panic!("expected a ViewError, got {other:?}"),
        };
        assert!(matches!(
            view(
                TurboQuantCacheSpec {
                    head_dim: 96,
                    ..spec(64)
                }
                .validate()
            ),
            ViewError::Length { got: 96, .. }
        ));
        assert!(matches!(
            view(
                TurboQuantCacheSpec {
                    batch: 0,
                    ..spec(64)
                }
                .validate()
            ),
            ViewError::Length { got: 0, .. }
        ));
        assert!(matches!(
            view(spec(0).validate()),
            ViewError::Length { got: 0, .. }
        ));
        // configurations off the kernels' closed list: typed, with what is supported
        let mut c = config(D);
        c.value_bits = 1;
        let e = TurboQuantCacheSpec {
            config: c,
            ..spec(64)
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("2, 3 or 4 bits"), "{e}");
        let mut c = config(D);
        c.qjl_dim = 64;
        let e = TurboQuantCacheSpec {
            config: c,
            ..spec(64)
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("qjl_dim"), "{e}");
        // plans
        let mut s = shape();
        s.heads_q = 7;
        let e =
            TurboQuantDecodePlan::new(&config(D), &s, &[1, 1], &[1, 1], sched(528)).unwrap_err();
        assert!(
            matches!(e, FerrattnError::View(ViewError::Length { got: 7, .. })),
            "{e}"
        );
        let e = TurboQuantDecodePlan::new(&config(D), &shape(), &[1, 1, 1], &[1, 1, 1], sched(528))
            .unwrap_err();
        assert!(
            matches!(e, FerrattnError::View(ViewError::Length { got: 3, .. })),
            "{e}"
        );
        // nothing to attend to: an empty sequence without an append
        let e = TurboQuantDecodePlan::new(&config(D), &shape(), &[0, 5], &[0, 0], sched(528))
            .unwrap_err();
        assert!(
            matches!(e, FerrattnError::View(ViewError::Length { got: 0, .. })),
            "{e}"
        );
        let e = TurboQuantSchedule::stream_k(0, &DeviceCaps::hopper_reference()).unwrap_err();
        assert!(
            matches!(e, FerrattnError::View(ViewError::Length { got: 0, .. })),
            "{e}"
        );
        let mut s = shape();
        s.softmax_scale = Some(f32::NAN);
        assert!(TurboQuantDecodePlan::new(&config(D), &s, &[1, 1], &[1, 1], sched(528)).is_err());
        // the config at another head dim than the shape's (qjl_dim 64 at d 128)
        let e = TurboQuantDecodePlan::new(&config(64), &shape(), &[1, 1], &[1, 1], sched(528))
            .unwrap_err();
        assert!(e.to_string().contains("qjl_dim"), "{e}");
    }
}

mod merge {
    use super::dev;
    use ferrattn::device_api::{validate_merge, Location, MergeViews, ViewError};
    use ferrattn::DType;

    const R: usize = 3;
    const B: usize = 2;
    const SQ: usize = 1;
    const H: usize = 8;
    const D: usize = 64;

    fn check(
        o: [usize; 5],
        lse: &[usize],
        out_dtype: DType,
        order: Option<&[usize]>,
    ) -> Result<(), ViewError> {
        let o = dev(0x1000_0000, DType::BF16, &o);
        let lse = dev(0x2000_0000, DType::F32, lse);
        let out = dev(0x3000_0000, out_dtype, &[B, SQ, H, D]);
        let out_lse = dev(0x4000_0000, DType::F32, &[B, H, SQ]);
        let x = MergeViews {
            o: &o,
            lse: &lse,
            out: &out,
            out_lse: &out_lse,
        };
        validate_merge(&x, order, Location::Cuda(0)).map(|_| ())
    }

    #[test]
    fn good_merge_views_pass_and_give_the_shape() {
        check(
            [R, B, SQ, H, D],
            &[R, B, H, SQ],
            DType::BF16,
            Some(&[2, 0, 1]),
        )
        .unwrap();
        check([R, B, SQ, H, D], &[R, B, H, SQ], DType::BF16, None).unwrap();
    }

    #[test]
    fn bad_merge_views_are_typed_errors_with_the_values() {
        // lse of the wrong shape
        match check([R, B, SQ, H, D], &[R, B, SQ, H], DType::BF16, None) {
            Err(ViewError::Shape {
                tensor: "lse",
                got,
                expected,
                ..
            }) => {
                assert_eq!(got, vec![R, B, SQ, H]);
                assert_eq!(expected, vec![R, B, H, SQ]);
            }
            other => panic!("{other:?}"),
        }
        // out in another dtype than the partials
        match check([R, B, SQ, H, D], &[R, B, H, SQ], DType::F16, None) {
            Err(ViewError::DType {
                tensor: "out",
                got: DType::F16,
                expected: DType::BF16,
            }) => {}
            other => panic!("{other:?}"),
        }
        // an order that is not a permutation
        assert!(matches!(
            check(
                [R, B, SQ, H, D],
                &[R, B, H, SQ],
                DType::BF16,
                Some(&[0, 0, 1])
            ),
            Err(ViewError::Length { got: 3, .. })
        ));
        assert!(matches!(
            check([R, B, SQ, H, D], &[R, B, H, SQ], DType::BF16, Some(&[0, 1])),
            Err(ViewError::Length { got: 2, .. })
        ));
        // no partial, and a head dim the kernel does not hold
        assert!(matches!(
            check([0, B, SQ, H, D], &[0, B, H, SQ], DType::BF16, None),
            Err(ViewError::Length { got: 0, .. })
        ));
        assert!(matches!(
            check([R, B, SQ, H, 512], &[R, B, H, SQ], DType::BF16, None),
            Err(ViewError::Length { got: 512, .. })
        ));
        // o of rank 4
        let o = dev(0x1000_0000, DType::BF16, &[B, SQ, H, D]);
        let lse = dev(0x2000_0000, DType::F32, &[B, H, SQ]);
        let x = MergeViews {
            o: &o,
            lse: &lse,
            out: &o,
            out_lse: &lse,
        };
        assert!(matches!(
            validate_merge(&x, None, Location::Cuda(0)),
            Err(ViewError::Rank {
                tensor: "o",
                got: 4,
                expected: 5,
                ..
            })
        ));
    }
}

// issue 9: `Runtime`'s variants are public, so a caller can wrap a backend that cannot run here;
// its caps, plan and run used to panic (`expect`) and are now the backend's typed "unavailable"
#[test]
fn runtime_over_an_unavailable_backend_is_a_typed_error() {
    use ferrattn::{Algorithm, AttentionInputs, AttentionOptions, Runtime, Tensor};
    let rt = Runtime::Cuda(Box::new(ferrattn_cuda::CudaBackend::new(0)));
    if rt.caps().is_ok() {
        return; // a machine with a GPU: nothing to refuse
    }
    let e = rt.caps().unwrap_err();
    assert!(
        matches!(&e, FerrattnError::Unavailable { backend, .. } if backend == "cuda"),
        "{e}"
    );
    let x = AttentionInputs::new(
        Tensor::zeros(&[1, 1, 2, 64], DType::F16),
        Tensor::zeros(&[1, 4, 2, 64], DType::F16),
        Tensor::zeros(&[1, 4, 2, 64], DType::F16),
    );
    let p = x.problem(AttentionOptions::default(), None).unwrap();
    let e = rt.plan(Algorithm::Lean, &p).unwrap_err();
    assert!(matches!(e, FerrattnError::Unavailable { .. }), "{e}");
    // a plan made elsewhere (the CPU's, relabelled) reaches `run`'s plan check, which needs caps
    let cpu = Runtime::Cpu(ferrattn_cpu::CpuBackend::new());
    let mut plan = cpu.plan(Algorithm::Lean, &p).unwrap();
    plan.backend = ferrattn::BackendKind::Cuda;
    let e = rt.run(&plan, &x).unwrap_err();
    assert!(matches!(e, FerrattnError::Unavailable { .. }), "{e}");
}

// issue 9: sizes whose products overflow `usize` (a page table "covering" more tokens than a
// usize counts, caps from a caller or a file with an absurd CTA count) are typed errors or
// saturate; they used to panic with "attempt to multiply with overflow"
#[test]
fn overflowing_sizes_are_typed_errors_not_panics() {
    let huge = usize::MAX / 2 + 1;
    // batch * max_pages overflows: the table cannot have that many entries
    let e = validate_lengths(
        &shape(),
        &[1, 1],
        &KvCache::Paged {
            page_size: PAGE,
            num_pages: POOL,
            max_pages: huge,
            page_table: &[0; 4],
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, ViewError::PageTableLength { got: 4, batch: B, max_pages } if max_pages == huge),
        "{e}"
    );
    // an empty batch has an empty table for any max_pages, but max_pages * page_size overflows
    let empty = DecodeShape {
        batch: 0,
        ..shape()
    };
    let kv = KvCache::Paged {
        page_size: PAGE,
        num_pages: POOL,
        max_pages: huge,
        page_table: &[],
    };
    let e = validate_lengths(&empty, &[], &kv).unwrap_err();
    assert!(
        matches!(e, ViewError::Length { got, .. } if got == huge),
        "{e}"
    );
    let e = DecodePlan::new(
        &empty,
        &DeviceCaps::hopper_reference(),
        &[],
        kv,
        1,
        LeanSchedule::StreamK,
    )
    .unwrap_err();
    assert!(
        matches!(e, FerrattnError::View(ViewError::Length { .. })),
        "{e}"
    );
    // caps with more CTA slots than a usize counts: the planner saturates and clamps the grid to
    // the work; the workspace bound refuses with the bytes it would need
    let mut caps = DeviceCaps::hopper_reference();
    caps.compute_units = huge;
    let plan = DecodePlan::new(
        &shape(),
        &caps,
        &[5, 7],
        paged(&table()),
        1,
        LeanSchedule::StreamK,
    )
    .unwrap();
    assert!(plan.workspace_bytes() > 0);
    let e = DecodePlan::stream_k_workspace_bound(&shape(), &caps, MAX_PAGES).unwrap_err();
    assert!(
        matches!(e, FerrattnError::Core(ferrattn::CoreError::TooLarge { bytes_needed, .. }) if bytes_needed > usize::MAX as u128),
        "{e}"
    );
    let wide = DecodeShape {
        head_dim: huge,
        ..shape()
    };
    let e = DecodePlan::stream_k_workspace_bound(&wide, &DeviceCaps::hopper_reference(), MAX_PAGES)
        .unwrap_err();
    assert!(
        matches!(e, FerrattnError::Core(ferrattn::CoreError::TooLarge { .. })),
        "{e}"
    );
}

// issue 9: `extent_bytes` and `contiguous_strides` are public: shapes and strides that reach past
// what a usize counts used to overflow there (a panic in debug builds, a wrapped small extent in
// release). They saturate now, so `validate` sees a short buffer; a plan over such a K/V is
// refused before any view is checked.
#[test]
fn views_whose_extent_overflows_saturate_and_such_plans_are_refused() {
    let huge = usize::MAX / 4;
    // SAFETY: never dereferenced.
    let x = unsafe { TensorView::cuda(0x1000_0000, 1 << 20, 0, DType::F16, &[3, 4], &[huge, 1]) }
        .unwrap();
    assert_eq!(x.extent_bytes(), usize::MAX);
    assert_eq!(
        ferrattn::device_api::contiguous_strides(&[2, huge, 8]),
        [usize::MAX, 8, 1]
    );
    let e = DecodePlan::new(
        &shape(),
        &DeviceCaps::hopper_reference(),
        &[5, 7],
        KvCache::Contiguous { max_seqlen_k: huge },
        1,
        LeanSchedule::StreamK,
    )
    .unwrap_err();
    assert!(
        matches!(e, FerrattnError::Core(ferrattn::CoreError::TooLarge { .. })),
        "{e}"
    );
}

// issue 9: cache specs whose capacity or bytes overflow used to panic in the public
// `capacity` / `allocated_bytes` (and in `TurboDevice::cache` before the allocation); lengths
// past i32 would have been truncated in the kernels' tables. `validate` refuses both now.
#[test]
fn oversized_cache_specs_are_typed_errors() {
    use ferrattn::device_api::{TurboCacheSpec, TurboQuantCacheSpec};
    use ferrattn::turboquant::TurboQuantConfig;
    let turbo = |batch, capacity_tokens| TurboCacheSpec {
        batch,
        heads_kv: HK,
        head_dim: D,
        bits: vec![4; HK],
        capacity_tokens,
    };
    let tq = |batch, capacity_tokens| TurboQuantCacheSpec {
        batch,
        heads_kv: HK,
        head_dim: D,
        capacity_tokens,
        config: TurboQuantConfig::paper_default(&ferrattn::AttentionProblem::uniform(
            1,
            1,
            1,
            1,
            1,
            D,
            D,
            DType::F16,
        )),
        compression: Default::default(),
    };
    assert!(turbo(B, 4096).validate().is_ok());
    assert!(tq(B, 4096).validate().is_ok());
    for cap in [usize::MAX, i32::MAX as usize + 1] {
        let e = turbo(B, cap).validate().unwrap_err();
        assert!(
            matches!(&e, ViewError::Length { what, got, .. } if what == "capacity_tokens" && *got == cap),
            "{e}"
        );
        assert_eq!(turbo(B, cap).allocated_bytes(), usize::MAX);
        assert!(turbo(B, cap).capacity() >= i32::MAX as usize);
        let e = tq(B, cap).validate().unwrap_err();
        assert!(
            matches!(&e, FerrattnError::View(ViewError::Length { got, .. }) if *got == cap),
            "{e}"
        );
        assert_eq!(tq(B, cap).allocated_bytes(), usize::MAX);
        assert_eq!(tq(B, cap).capacity(), cap);
    }
    // a batch whose cache bytes pass isize::MAX
    let e = turbo(usize::MAX / 64, 4096).validate().unwrap_err();
    assert!(e.to_string().contains("one allocation"), "{e}");
    assert_eq!(turbo(usize::MAX / 64, 4096).allocated_bytes(), usize::MAX);
    let e = tq(usize::MAX / 64, 4096).validate().unwrap_err();
    assert!(e.to_string().contains("one allocation"), "{e}");
    assert_eq!(tq(usize::MAX / 64, 4096).allocated_bytes(), usize::MAX);
}
