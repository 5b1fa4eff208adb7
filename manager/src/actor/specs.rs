//! The full spec of every job the core holds (image, args, env: what a Start carries), kept as
//! its protobuf encoding.
//!
//! A decoded `pb::JobSpec` is ~300 bytes of struct before its strings, and the manager keeps one
//! per live job; its encoding is the size of what the user sent (~60 bytes for a small job) and
//! is also what the store writes. Specs are decoded only where they are read: a Start (once per
//! incarnation) and a `GetJob`/`ListJobs` answer.
//!
//! The jobs are also found by name ([`Specs::named`]): a name filter decoded every spec held,
//! and a submission is told of the jobs that already have its name.

use std::collections::HashMap;

use converge_core::cluster::types::JobId;
use converge_messenger::pb::JobSpec;
use prost::Message;

/// Specs by job, encoded, and the jobs by name.
#[derive(Default)]
pub struct Specs {
    specs: HashMap<JobId, Box<[u8]>>,
    /// The jobs held with each name (unnamed jobs are not indexed).
    names: HashMap<String, Vec<JobId>>,
}

impl Specs {
    /// Keeps `spec` for job `id`.
    pub fn insert(&mut self, id: JobId, spec: &JobSpec) {
        self.index(&id, &spec.name);
        self.specs
            .insert(id, spec.encode_to_vec().into_boxed_slice());
    }

    /// Keeps an encoded spec (read back from the store) for job `id`, if it decodes.
    pub fn insert_encoded(&mut self, id: JobId, bytes: Vec<u8>) -> Result<(), prost::DecodeError> {
        let spec = JobSpec::decode(bytes.as_slice())?;
        self.index(&id, &spec.name);
        self.specs.insert(id, bytes.into_boxed_slice());
        Ok(())
    }

    fn index(&mut self, id: &JobId, name: &str) {
        if !name.is_empty() && !self.specs.contains_key(id) {
            self.names
                .entry(name.to_string())
                .or_default()
                .push(id.clone());
        }
    }

    /// Job `id`'s spec, decoded.
    pub fn get(&self, id: &str) -> Option<JobSpec> {
        // Only ever holds what `insert`/`insert_encoded` checked, so decoding cannot fail.
        self.specs
            .get(id)
            .and_then(|b| JobSpec::decode(&b[..]).ok())
    }

    /// Job `id`'s spec as the store writes it.
    pub fn encoded(&self, id: &str) -> Option<&[u8]> {
        self.specs.get(id).map(|b| &b[..])
    }

    /// The jobs held that are named `name`, in the order they came.
    pub fn named(&self, name: &str) -> &[JobId] {
        self.names.get(name).map_or(&[], Vec::as_slice)
    }

    /// Forgets job `id`'s spec.
    pub fn remove(&mut self, id: &str) {
        let Some(name) = self.get(id).map(|s| s.name) else {
            return;
        };
        self.specs.remove(id);
        if let Some(ids) = self.names.get_mut(&name) {
            ids.retain(|o| o.as_str() != id);
            if ids.is_empty() {
                self.names.remove(&name);
            }
        }
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

    #[test]
    fn jobs_are_found_by_name_while_their_specs_are_held() {
        let named = |name: &str| JobSpec {
            name: name.into(),
            ..Default::default()
        };
        let mut specs = Specs::default();
        specs.insert("a".into(), &named("resnet"));
        specs.insert("b".into(), &named(""));
        let bytes = named("resnet").encode_to_vec();
        specs.insert_encoded("c".into(), bytes).unwrap();
        // Held again (a store read after a submission): still once.
        specs.insert("a".into(), &named("resnet"));
        assert_eq!(specs.named("resnet"), ["a", "c"]);
        assert!(specs.named("").is_empty(), "unnamed jobs are not indexed");
        specs.remove("a");
        assert_eq!(specs.named("resnet"), ["c"]);
        specs.remove("c");
        assert!(specs.named("resnet").is_empty());
        assert!(specs.names.is_empty(), "no name is kept without a job");
    }
}
