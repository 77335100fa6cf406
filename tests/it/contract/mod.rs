//! The published contract cannot drift from the code: every refusal reason
//! the code can send is in `proto/refusal.schema.json` and the schema names
//! no other (`refusals`), and every example in the OpenAPI files validates
//! against its own definition (`openapi`). Beside these, every refusal the
//! rest of the suite reads goes through the schema
//! (`support::contract`).

mod openapi;
mod refusals;
