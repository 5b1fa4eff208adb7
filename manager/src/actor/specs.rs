//! The full spec of every job the core holds (image, args, env: what a Start carries), kept as
//! its protobuf encoding.
//!
//! A decoded `pb::JobSpec` is ~300 bytes of struct before its strings, and the manager keeps one
//! per live job; its encoding is the size of what the user sent (~60 bytes for a small job) and
//! is also what the store writes. Specs are decoded only where they are read: a Start (once per
//! incarnation) and a `GetJob`/`ListJobs` answer.

use std::collections::HashMap;

use converge_core::cluster::types::JobId;
use converge_messenger::pb::JobSpec;
use prost::Message;

/// Specs by job, encoded.
#[derive(Default)]
pub struct Specs(HashMap<JobId, Box<[u8]>>);

impl Specs {
    /// Keeps `spec` for job `id`.
    pub fn insert(&mut self, id: JobId, spec: &JobSpec) {
        self.0.insert(id, spec.encode_to_vec().into_boxed_slice());
    }

    /// Keeps an encoded spec (read back from the store) for job `id`, if it decodes.
    pub fn insert_encoded(&mut self, id: JobId, bytes: Vec<u8>) -> Result<(), prost::DecodeError> {
        JobSpec::decode(bytes.as_slice())?;
        self.0.insert(id, bytes.into_boxed_slice());
        Ok(())
    }

    /// Job `id`'s spec, decoded.
    pub fn get(&self, id: &str) -> Option<JobSpec> {
        // Only ever holds what `insert`/`insert_encoded` checked, so decoding cannot fail.
        self.0.get(id).and_then(|b| JobSpec::decode(&b[..]).ok())
    }

    /// Job `id`'s spec as the store writes it.
    pub fn encoded(&self, id: &str) -> Option<&[u8]> {
        self.0.get(id).map(|b| &b[..])
    }

    /// Forgets job `id`'s spec.
    pub fn remove(&mut self, id: &str) {
        self.0.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_reads_back_as_it_was_given_and_as_the_store_writes_it() {
        let spec = JobSpec {
            image: "converge/trainer:dev".into(),
            args: vec!["--model".into(), "mnist-pytorch".into()],
            cpus: 1.5,
            ..Default::default()
        };
        let mut specs = Specs::default();
        specs.insert("a".into(), &spec);
        assert_eq!(specs.get("a"), Some(spec.clone()));
        assert_eq!(specs.encoded("a"), Some(spec.encode_to_vec().as_slice()));
        assert!(specs.insert_encoded("b".into(), vec![0xff, 0xff]).is_err());
        assert_eq!(specs.get("b"), None, "bytes that do not decode are refused");
        specs.remove("a");
        assert_eq!(specs.get("a"), None);
    }
}
