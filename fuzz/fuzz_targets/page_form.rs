#![no_main]
// The input goes to credbroker::fuzzing, which holds the invariants.
libfuzzer_sys::fuzz_target!(|data: &[u8]| { credbroker::fuzzing::page_form(data); });
