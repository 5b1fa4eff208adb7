//! [`Id`]: an id shared rather than copied, for jobs, workers and commands.

use serde::{Deserialize, Serialize};

/// An id, shared rather than copied: the core keeps a job's id in its map of jobs, in the job,
/// in its worker's set and in the store's pending changes, and a worker's id in every job
/// placed there. As `String`s each copy took its own allocation (a UUID: 24 bytes inline and
/// 48 at the allocator); an `Id` is 16 bytes inline and every clone shares one allocation
/// (issue 17's budget of 2 KB per live job, `docs/performance.md`; the cluster core's
/// `JobId`, `WorkerId` and `CommandId` are this type). It compares, orders,
/// hashes, prints and serializes as its text, so maps keyed by it are looked up with a
/// `&str` and stored records read the same as before.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id(std::sync::Arc<str>);

impl Id {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Id {
    fn default() -> Self {
        Id::from("")
    }
}

impl std::ops::Deref for Id {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Id {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Id {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Id(s.into())
    }
}

impl From<&&str> for Id {
    fn from(s: &&str) -> Self {
        Id((*s).into())
    }
}

impl From<String> for Id {
    fn from(s: String) -> Self {
        Id(s.into())
    }
}

impl From<&String> for Id {
    fn from(s: &String) -> Self {
        Id(s.as_str().into())
    }
}

impl From<&Id> for Id {
    fn from(s: &Id) -> Self {
        s.clone()
    }
}

impl From<Id> for String {
    fn from(id: Id) -> Self {
        id.0.to_string()
    }
}

impl PartialEq<str> for Id {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Id {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Id {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Id> for str {
    fn eq(&self, other: &Id) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Id> for &str {
    fn eq(&self, other: &Id) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<Id> for String {
    fn eq(&self, other: &Id) -> bool {
        **self == *other.0
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Id::from)
    }
}
