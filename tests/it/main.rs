//! Every integration test, one module per concern (see `tests/README.md` for the map). The
//! scenarios that touch a store run on both: the embedded SQLite file and DynamoDB on moto.

/// Registers scenarios, each an `async fn(StoreKind)`, once per store under their own
/// names: `<module>::sqlite::<scenario>` and `<module>::dynamodb::<scenario>`.
macro_rules! on_both_stores {
    ($($scenario:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario($crate::support::StoreKind::Sqlite).await
                }
            )+
        }

        mod dynamodb {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario($crate::support::StoreKind::Dynamo).await
                }
            )+
        }
    };
}

mod backlog;
mod budget;
mod callbacks;
mod chaos;
mod docs;
mod end_to_end;
mod fair;
mod faults;
mod fleet;
mod hostile_results;
mod image;
mod infra;
mod lambda_events;
mod lambda_watch;
mod local_run;
mod operator;
mod packaging;
mod profiles;
mod properties;
mod queues;
mod reuse;
mod riding;
mod runner;
mod rush;
mod secrets;
mod shared_limits;
mod status_page;
mod store_contract;
mod submit_api;
mod support;
mod sweep;
mod sweep_memory;
mod template;
mod workspace;
