//! `palisade`: see [`palisade_sim::cli`].

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_int, c_long, c_void};

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// The binary's allocator: mimalloc, for the sweep's many short-lived strings and JSON trees
/// (see `Cargo.toml`). Only this binary sets it; the library and its embedders do not.
#[global_allocator]
static ALLOCATOR: Mimalloc = Mimalloc;

/// The largest alignment every block of mimalloc's plain `mi_malloc` has: its smallest
/// block is one machine word and every block size is a multiple of a word, in pages that
/// start word-aligned (`MI_INTPTR_SIZE`). Not 16: a 24-byte block is only 8-aligned.
const PLAIN_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc behind `GlobalAlloc`, taking its plain entry points for every layout they
/// already satisfy.
///
/// The `mimalloc` crate's own `MiMalloc` calls `mi_malloc_aligned` / `mi_realloc_aligned`
/// for every layout, alignment 1 included; mimalloc v3 sends each such request that is not
/// a small block of a power-of-two size through its generic aligned path (an over-allocation
/// and an adjustment), which was about 3 % of a `swarm` seed's instructions. Nearly all of
/// the sweep's allocations are strings and vectors of alignment 1 to 8, which `mi_malloc`
/// satisfies as it is (see [`PLAIN_ALIGN`]); only larger alignments take the aligned calls.
/// `mi_free` frees a block of either kind.
struct Mimalloc;

// SAFETY: every method forwards to mimalloc, which is thread-safe and returns blocks of at
// least the requested size (or null on failure). A layout whose alignment is at most
// `PLAIN_ALIGN` gets a plain block, which is always `PLAIN_ALIGN`-aligned; any other
// layout gets mimalloc's aligned call with that alignment. `realloc` keeps the layout's
// alignment (GlobalAlloc's contract), so a block is always resized by the same family
// that allocated it, and `mi_realloc`/`mi_realloc_aligned` keep the contents up to the
// smaller size. `mi_free` takes any block mimalloc returned. The tests below check the
// alignment, size and contents for many layouts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarding to mimalloc; see the impl's comment.
        unsafe { block(layout, mi_malloc, mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarding to mimalloc; see the impl's comment.
        unsafe { block(layout, mi_zalloc, mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract), so from mimalloc.
        unsafe { mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; see the impl's comment.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

/// A new block for `layout`: from `plain` when a word's alignment is enough, else from
/// `aligned` (the same call's aligned form: `mi_malloc` / `mi_malloc_aligned`, or
/// `mi_zalloc` / `mi_zalloc_aligned`).
///
/// # Safety
/// As `GlobalAlloc::alloc`: `layout` has a non-zero size.
#[allow(unsafe_code)]
#[inline]
unsafe fn block(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: both are mimalloc's allocation calls, valid for any size and (for `aligned`)
    // any power-of-two alignment, which a `Layout`'s always is.
    unsafe {
        if layout.align() <= PLAIN_ALIGN {
            plain(layout.size()) as *mut u8
        } else {
            aligned(layout.size(), layout.align()) as *mut u8
        }
    }
}

// mimalloc's option calls (in the C library `libmimalloc-sys` links; its Rust declarations
// sit behind the crate's `extended` feature, which would add a dependency for two lines).
#[allow(unsafe_code)]
extern "C" {
    #[cfg(test)]
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_t` (`include/mimalloc.h`): how long
/// freed memory waits before it is returned to the OS, in milliseconds (default 1,000);
/// -1 never.
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// The environment variable through which mimalloc reads the same option.
const PURGE_DELAY_VAR: &str = "MIMALLOC_PURGE_DELAY";

/// Sets mimalloc's options for a sweep, unless the environment sets them.
///
/// When every seed ran on a fresh thread with a fresh heap, each finished seed's pages went
/// back to the OS (decommitted) a second later, so the next seeds touched fresh pages again:
/// page faults and the kernel's zeroing of each page (`clear_page`), counted as system time.
/// Never purging keeps the freed pages for the next seeds: over 3,000 `swarm` seeds
/// (`--jobs 1`) 12.4 thousand minor faults instead of 56–58 thousand and 0.61–0.70 s of
/// system time instead of 0.96–1.25 s, user time within its noise, 0.1 % fewer instructions
/// (reports/bench.md, "Sim: agent8"). The price is that the process keeps its peak heap
/// until it exits, which for a sweep is what it would reach again at the next seed anyway.
fn tune_allocator() {
    if std::env::var_os(PURGE_DELAY_VAR).is_none() {
        // SAFETY: a plain setter of mimalloc's option table, callable at any time.
        #[allow(unsafe_code)]
        unsafe {
            mi_option_set(MI_OPTION_PURGE_DELAY, -1)
        };
    }
}

/// The purge delay mimalloc uses now.
#[cfg(test)]
fn purge_delay() -> c_long {
    // SAFETY: a plain getter of mimalloc's option table, callable at any time.
    #[allow(unsafe_code)]
    unsafe {
        mi_option_get(MI_OPTION_PURGE_DELAY)
    }
}

fn main() -> std::process::ExitCode {
    tune_allocator();
    palisade_sim::cli::main()
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    /// Every alignment from 1 to 4 KiB, with sizes around the small, medium and large
    /// block limits.
    fn layouts() -> Vec<Layout> {
        let sizes = [
            1usize, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 48, 100, 1000, 1024, 1025, 4095, 8191,
            70_000, 300_000,
        ];
        let mut all = Vec::new();
        for shift in 0..=12 {
            for &size in &sizes {
                all.push(Layout::from_size_align(size, 1 << shift).expect("valid layout"));
            }
        }
        all
    }

    fn fill(ptr: *mut u8, len: usize, salt: usize) {
        for i in 0..len {
            // SAFETY: `ptr` points at a live block of at least `len` bytes.
            unsafe { ptr.add(i).write((i ^ salt) as u8) };
        }
    }

    fn holds(ptr: *const u8, len: usize, salt: usize) -> bool {
        // SAFETY: `ptr` points at a live block of at least `len` initialised bytes.
        (0..len).all(|i| unsafe { ptr.add(i).read() } == (i ^ salt) as u8)
    }

    /// Blocks of one layout live at once: enough that consecutive blocks of a size class
    /// whose blocks are not all aligned (24 bytes with alignment 16) show it.
    const LIVE: usize = 64;

    #[test]
    fn blocks_are_aligned_writable_and_freed_for_every_layout() {
        for layout in layouts() {
            let mut live = Vec::with_capacity(LIVE);
            for salt in 0..LIVE {
                // SAFETY: non-zero size; the block is freed with its layout below.
                let ptr = unsafe { ALLOCATOR.alloc(layout) };
                assert!(!ptr.is_null(), "{layout:?}");
                assert_eq!(ptr as usize % layout.align(), 0, "{layout:?}");
                fill(ptr, layout.size(), salt);
                live.push(ptr);
            }
            for (salt, ptr) in live.into_iter().enumerate() {
                assert!(holds(ptr, layout.size(), salt), "{layout:?}");
                // SAFETY: allocated above with `layout`.
                unsafe { ALLOCATOR.dealloc(ptr, layout) };
            }
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_and_aligned_for_every_layout() {
        for layout in layouts() {
            // SAFETY: non-zero size; the block is freed with its layout below.
            let ptr = unsafe { ALLOCATOR.alloc_zeroed(layout) };
            assert!(!ptr.is_null(), "{layout:?}");
            assert_eq!(ptr as usize % layout.align(), 0, "{layout:?}");
            // SAFETY: a live block of `layout.size()` bytes.
            assert!((0..layout.size()).all(|i| unsafe { ptr.add(i).read() } == 0));
            // SAFETY: allocated above with `layout`.
            unsafe { ALLOCATOR.dealloc(ptr, layout) };
        }
    }

    #[test]
    fn realloc_keeps_contents_and_alignment_growing_and_shrinking() {
        for layout in layouts() {
            for new_size in [1, layout.size() / 2 + 1, layout.size() * 3 + 5, 200_000] {
                // SAFETY: non-zero size; the block is freed with its final layout below.
                let ptr = unsafe { ALLOCATOR.alloc(layout) };
                assert!(!ptr.is_null(), "{layout:?}");
                fill(ptr, layout.size(), 11);
                // SAFETY: `ptr` is live with `layout`; `new_size` is non-zero.
                let grown = unsafe { ALLOCATOR.realloc(ptr, layout, new_size) };
                assert!(!grown.is_null(), "{layout:?} -> {new_size}");
                assert_eq!(
                    grown as usize % layout.align(),
                    0,
                    "{layout:?} -> {new_size}"
                );
                let kept = layout.size().min(new_size);
                assert!(holds(grown, kept, 11), "{layout:?} -> {new_size}");
                fill(grown, new_size, 13);
                let new_layout =
                    Layout::from_size_align(new_size, layout.align()).expect("valid layout");
                // SAFETY: `grown` is live with `new_layout`.
                unsafe { ALLOCATOR.dealloc(grown, new_layout) };
            }
        }
    }

    #[test]
    fn the_sweep_never_purges_unless_the_environment_says_otherwise() {
        if std::env::var_os(PURGE_DELAY_VAR).is_some() {
            // The operator's setting wins; nothing of ours to check.
            tune_allocator();
            return;
        }
        // Option 15 is the purge delay: it reads as mimalloc v3's default for it, 1,000 ms
        // (`src/options.c`; options 14 and 16 beside it default to 1 and 0), until `main`
        // sets it.
        assert_eq!(purge_delay(), 1_000);
        tune_allocator();
        assert_eq!(purge_delay(), -1);
    }

    #[test]
    fn collections_work_on_the_installed_allocator() {
        let mut v: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
        v.retain(|s| s.len() % 2 == 0);
        let joined: String = v.concat();
        assert!(joined.starts_with("10111213"));
        #[repr(align(64))]
        struct Wide([u8; 64]);
        let wide: Vec<Box<Wide>> = (0..100).map(|i| Box::new(Wide([i as u8; 64]))).collect();
        for (i, w) in wide.iter().enumerate() {
            assert_eq!(&**w as *const Wide as usize % 64, 0);
            assert_eq!(w.0[63], i as u8);
        }
    }
}
