//! The counter counts what the process asks of the allocator.
#![allow(missing_docs)]

use credbroker_alloc_count::{counts, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn each_allocation_and_its_bytes_are_counted() {
    let (calls0, bytes0) = counts();
    // Ten boxes of 1000 bytes, each one allocation, kept until counted.
    let boxes: Vec<Box<[u8; 1000]>> = (0..10)
        .map(|i| std::hint::black_box(Box::new([i as u8; 1000])))
        .collect();
    let (calls1, bytes1) = counts();
    assert_eq!(boxes.len(), 10);
    // The ten boxes and the vector (other threads of the harness may add
    // a few of their own meanwhile).
    assert!(calls1 - calls0 >= 11, "{} calls counted", calls1 - calls0);
    assert!(
        bytes1 - bytes0 >= 10_000,
        "{} bytes counted",
        bytes1 - bytes0
    );
    // Freeing is not an allocation.
    drop(boxes);
    let (calls2, _) = counts();
    assert!(
        calls2 - calls1 < 5,
        "{} calls counted for frees",
        calls2 - calls1
    );
}
