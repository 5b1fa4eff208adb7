//! The control client: the manager's `ControlService` with the caller's bearer token on every
//! call. convergectl and `cargo xtask` (demo, experiments) both speak through it.

use converge_messenger::pb::control_service_client::ControlServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Adds `authorization: Bearer TOKEN` to every call (nothing without a token).
#[derive(Clone)]
pub struct Bearer(pub Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A control client with a [`Bearer`].
pub type Client = ControlServiceClient<InterceptedService<Channel, Bearer>>;
