#![no_main]
// The input goes to credbroker::internals::fuzzing, which holds the invariants.
libfuzzer_sys::fuzz_target!(|data: &[u8]| { credbroker::internals::fuzzing::dpop_signed(data); });
