//! A global allocator that counts, for the tests and benchmarks that hold a path to zero heap
//! allocations per packet (`core/tests/engine_allocs.rs`, the engine and reply-path
//! benchmarks, the transform tests). Only they install it:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: common::alloc_count::CountingAlloc = common::alloc_count::CountingAlloc;
//! ```
//!
//! The daemons never do. The count is per thread, so tests running side by side in one process
//! do not see each other's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // const-initialised and without a destructor: reading it never allocates.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Forwards every call to the system allocator, counting allocations and reallocations.
pub struct CountingAlloc;

/// Allocations and reallocations made by this thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn note_allocation() {
    // `try_with`: during thread teardown the slot may be gone; such allocations go uncounted.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}
